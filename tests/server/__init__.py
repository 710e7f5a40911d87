"""Tests of the gRPC service: errors and statuses, Step queue, Interact, exactly-once ledger, wire
reader, ranks and hosts, the JS client."""
