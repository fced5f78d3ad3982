#!/bin/sh
# Aokun web panel on macOS: double-click in Finder to open it in your browser; close the Terminal
# window (or press Ctrl+C) to stop it. Uses .venv/bin/python beside aokun.py when there is one.
cd "$(dirname "$0")/.." || exit 1
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
exec "$PY" aokun.py panel "$@"
