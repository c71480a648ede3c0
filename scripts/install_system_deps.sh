#!/usr/bin/env bash
# Debian packages some tests need, installed when missing (as root, or with sudo that asks no password):
#   chromium    tests/test_report_browser.py opens every kind of report in a real browser (Playwright drives it)
#   postgresql  tests/test_team_mlflow.py runs a throw-away team MLflow server on a PostgreSQL store
# Best effort: without apt (or rights) it says so and the tests that need a package skip, saying why.
set -uo pipefail

need=()
[[ -x /usr/bin/chromium ]] || need+=(chromium)
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[[ ${#need[@]} -eq 0 ]] && exit 0

SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "system packages missing: ${need[*]}; install them with: sudo apt-get install -y ${need[*]} (their tests skip until then)" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system packages missing: ${need[*]}; no apt-get here: install them with your package manager (their tests skip until then)" >&2
  exit 0
fi
echo "installing system packages: ${need[*]}"
{ $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; } \
  || echo "could not install ${need[*]} (apt-get failed); their tests skip, saying why" >&2
exit 0
