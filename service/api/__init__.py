"""Trident's public gRPC contract: generated stubs of protos/trident/v1 and the tensor codec."""
