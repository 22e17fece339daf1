package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StartNATS runs an in-process nats-server with JetStream on a random port
// and file storage in a temporary directory; it stops when the test ends.
func StartNATS(t testing.TB) *server.Server {
	t.Helper()
	return StartNATSDir(t, t.TempDir(), -1)
}

// StartNATSDir is StartNATS with a given storage directory and port (-1 for
// a random one), so that a test can restart a server on the same data.
func StartNATSDir(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	return StartNATSWith(t, &server.Options{Port: port, StoreDir: dir})
}

// StartNATSWith runs an in-process nats-server with opts (users, limits),
// on 127.0.0.1 when opts names no host, storing in a temporary directory
// when it names none, with JetStream, and without signal handlers or logs;
// it stops when the test ends.
func StartNATSWith(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	opts.JetStream, opts.NoSigs, opts.NoLog = true, true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("testenv: nats-server: %v", err)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("testenv: nats-server did not become ready in 10s")
	}
	return srv
}

// JetStream connects to the NATS server at url for a test, closing the
// connection when the test ends.
func JetStream(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
