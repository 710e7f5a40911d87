#!/usr/bin/env bash
# Regenerate the Python stubs of protos/trident/v1/*.proto into service/api/trident/v1/.
# Pinned generator (see pyproject's `test` extra): its stubs need grpcio >= 1.84 and
# protobuf >= 7.35 at run time, which the GPU hosts have too. tests/server/test_protos.py fails when
# the checked-in stubs differ from what this script writes.
# The files are compiled from protos/, so each registers (and reflection serves) the name a
# client in any language imports, trident/v1/trainer.proto; the stubs live in the package
# `service.api.trident.v1`, so their module paths are rewritten to it.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
python3 -m grpc_tools.protoc -Iprotos \
  --python_out="$gen" --pyi_out="$gen" --grpc_python_out="$gen" \
  protos/trident/v1/trainer.proto
mkdir -p "$out/service/api/trident/v1"
for file in trainer_pb2.py trainer_pb2.pyi trainer_pb2_grpc.py; do
  sed -e 's/^from trident\.v1 import /from service.api.trident.v1 import /' \
      -e "s/'trident\.v1\.trainer_pb2'/'service.api.trident.v1.trainer_pb2'/" \
      -e 's# trident/v1/trainer_pb2_grpc\.py # service/api/trident/v1/trainer_pb2_grpc.py #' \
      "$gen/trident/v1/$file" > "$out/service/api/trident/v1/$file"
done
