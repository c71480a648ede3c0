"""The standalone HTML report read back from MLflow."""
