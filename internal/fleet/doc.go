// Package fleet holds the tests of a throttler fleet on the distributed
// engines it is built on: several instances sharing a three-node JetStream
// cluster with nats.replicas 3, a Redis master with a replica and three
// sentinels, a Redis Cluster of three masters with replicas, a Redis that
// restarts empty, two deployments sharing one NATS account under different
// nats.prefix values, and a Redis 1 ms and 3 ms away behind a latency proxy
// (toxiproxy, in process). Each test starts the real servers
// (internal/testenv), kills one mid-drain or puts it far away, and checks
// that every accepted job arrives and that no window holds more than
// burst + rate·W (at the target, or on the drains' start times).
//
// The package has no code of its own: its tests are heavy (tens of seconds
// each), and live apart so that go test runs them in parallel with the other
// packages' tests.
package fleet
