#!/usr/bin/env bash
# Regenerate the Python stubs of protos/trident/v1/*.proto into service/api/trident/v1/.
# Pinned generator (see pyproject's `test` extra): its stubs need grpcio >= 1.84 and
# protobuf >= 7.35 at run time, which the GPU hosts have too. tests/test_protos.py fails when
# the checked-in stubs differ from what this script writes.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
python3 -m grpc_tools.protoc \
  -Iservice/api/trident=protos/trident \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  protos/trident/v1/trainer.proto
