#!/usr/bin/env bash
# A virtual environment with MLflow (mlflow-skinny and the data packages its pyfunc scoring
# server needs) and scikit-learn, pinned, for the MLflow flavors' test (external_test.py
# MlflowFlavors): `runtime: auto` on a non-xgboost MLflow model runs `mlflow models serve` from
# flotilla up's PATH. Made once at $1 (default build/mlflow-venv) and reused; prints the venv's
# python. Exits non-zero, with the reason on stderr, when it cannot be made (no network to
# PyPI): the test then skips.
set -euo pipefail
MLFLOW_VERSION=3.1.1
SKLEARN_VERSION=1.9.1
PANDAS_VERSION=3.1.1
# MLflow 3.1's scoring server calls FastAPI's app.route, which FastAPI removed after 0.115.
FASTAPI_VERSION=0.115.14
VENV=${1:-build/mlflow-venv}
exec bash "$(dirname "$0")/pinned_venv.sh" "$VENV" \
  "mlflow-skinny==$MLFLOW_VERSION" "scikit-learn==$SKLEARN_VERSION" "pandas==$PANDAS_VERSION" \
  "fastapi==$FASTAPI_VERSION"
