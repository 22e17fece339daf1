package queue_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestPublisherReadsItsLanesResults: a publisher of the embedded server
// may read the settled records of its lanes (throttler.results.<lane>.>)
// and of no other lane; one allowed on every lane reads them all.
func TestPublisherReadsItsLanesResults(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATSWith(t, &server.Options{Port: -1, StoreDir: t.TempDir(), Users: []*server.User{
		{Username: "throttler", Password: "s3cret"},
		{Username: "shop", Password: "pub", Permissions: queue.PublisherPermissions("shop", []string{"demo"})},
		{Username: "all", Password: "pub", Permissions: queue.PublisherPermissions("all", nil)},
	}})
	addr := srv.Addr().String()
	var mu sync.Mutex
	var violations []error
	connect := func(user, pass string) *nats.Conn {
		nc, err := nats.Connect("nats://"+user+":"+pass+"@"+addr, nats.CustomInboxPrefix(queue.UserInbox(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				violations = append(violations, err)
				mu.Unlock()
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	thr, shop, all := connect("throttler", "s3cret"), connect("shop", "pub"), connect("all", "pub")
	heard := func(nc *nats.Conn, subject string) *nats.Subscription {
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		return sub
	}
	own := heard(shop, "throttler.results.demo.>")
	other := heard(shop, "throttler.results.other.>")
	every := heard(all, "throttler.results.>")
	testenv.Eventually(t, 5*time.Second, "the refused subscription reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(violations) == 1
	})
	for _, s := range []string{api.ResultsSubject("demo", "a.1"), api.ResultsSubject("other", "b")} {
		if err := thr.Publish(s, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	_ = thr.Flush()
	if m, err := own.NextMsg(5 * time.Second); err != nil || m.Subject != "throttler.results.demo.~YS4x" {
		t.Fatalf("shop on its lane's results: %v %v", m, err)
	}
	for range 2 {
		if _, err := every.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("a publisher of every lane: %v", err)
		}
	}
	if m, err := other.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("shop read another lane's result: %s", m.Subject)
	}
}
