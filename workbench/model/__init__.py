"""The generative model: backbones with the SID vocabulary, the soft-token projector, the checkpoint format."""
