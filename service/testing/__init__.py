"""The harness the tests and the benches share: a real `trident serve` process on loopback
(serverproc), a storm of abusive Interact clients as a process of its own (storm), the tests'
models and random rollouts (models), and what a benchmark's JSON records about its machine
(host_report). Shipped with the package, so a bench script and a test import it the same way,
installed or from a checkout."""
