package service_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// holdingTarget answers 200, counting deliveries by Idempotency-Key (the
// job's id); a job whose body is "hold" is answered once release is
// closed.
func holdingTarget(t *testing.T) (srv *httptest.Server, deliveries func(id string) int, release func()) {
	t.Helper()
	var mu sync.Mutex
	n := map[string]int{}
	held := make(chan struct{})
	var once sync.Once
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		buf := make([]byte, 4)
		k, _ := r.Body.Read(buf)
		if string(buf[:k]) == "hold" {
			select {
			case <-held:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(srv.Close)
	t.Cleanup(release)
	return srv, func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return n[id]
	}, release
}

const (
	claimOK    = `throttler_job_record_writes_total{lane="demo",result="ok",write="claim"}`
	claimError = `throttler_job_record_writes_total{lane="demo",result="error",write="claim"}`
	endOK      = `throttler_job_record_writes_total{lane="demo",result="ok",write="end"}`
	endError   = `throttler_job_record_writes_total{lane="demo",result="error",write="end"}`
	waiters    = `throttler_job_waiters`
)

// TestRecordWritesAndWaitersCounted: a lane with results has its record
// write series from the start, at 0, and a lane without none; a caller
// waiting for its job (?wait=) shows in throttler_job_waiters while its
// delivery runs and leaves it when answered; the delivery counts one claim
// and one end, both ok.
func TestRecordWritesAndWaitersCounted(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, deliveries, release := holdingTarget(t)
	reg := prometheus.NewRegistry()
	svc := runWithRegistry(t, recordsConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL), reg)
	read := func() servicetest.Series { return servicetest.Gather(t, reg) }

	got := read()
	for _, s := range []string{claimOK, claimError, endOK, endError, waiters} {
		if v, ok := got.Get(s); !ok || v != 0 {
			t.Fatalf("%s = %v (present %v) at the start, want 0", s, v, ok)
		}
	}
	if s := got.Grep(`throttler_job_record_writes_total{lane="plain"`); s != "" {
		t.Fatalf("the lane without results has record write series:\n%s", s)
	}

	answered := make(chan jobCall, 1)
	go func() {
		answered <- callJob(t, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs?wait=20s", "held", "hold")
	}()
	servicetest.WaitFor(t, 10*time.Second, read, map[string]float64{waiters: 1, claimOK: 1})
	testenv.Eventually(t, 10*time.Second, "the held job at the target", func() bool { return deliveries("held") == 1 })
	release()
	if c := <-answered; c.code != http.StatusOK {
		t.Fatalf("waited job: %d %q", c.code, c.body)
	}
	servicetest.WaitFor(t, 10*time.Second, read, map[string]float64{waiters: 0, claimOK: 1, endOK: 1, claimError: 0, endError: 0})
}

// TestRecordClaimFailureCountedJobKept: while the lane's records bucket is
// gone, a job's claim fails: counted as an error, the job is not delivered
// and waits. With the bucket back the job is delivered once, its claim
// and end counted ok.
func TestRecordClaimFailureCountedJobKept(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, deliveries, _ := holdingTarget(t)
	reg := prometheus.NewRegistry()
	svc := runWithRegistry(t, recordsConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL), reg)
	read := func() servicetest.Series { return servicetest.Gather(t, reg) }

	nc, publish := natsPublisher(t, natsSrv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := js.DeleteKeyValue(ctx, records.BucketName("demo")); err != nil {
		t.Fatal(err)
	}
	publish("throttle.demo", "lost-1", "p1", nats.Header{})

	// The job comes again after each failed claim (a second after it).
	servicetest.WaitFor(t, 15*time.Second, read, map[string]float64{claimError: 2})
	if n := deliveries("lost-1"); n != 0 {
		t.Fatalf("delivered %d times without a record", n)
	}
	if v, _ := read().Get(claimOK); v != 0 {
		t.Fatalf("claims ok while the bucket is gone: %v", v)
	}

	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: records.BucketName("demo"), History: 1, TTL: time.Hour,
		Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the job delivered", func() bool {
		_, rec := getRecord(t, svc.Addr(), "demo", "lost-1")
		return rec.State == api.StateDelivered
	})
	waitSettled(t, svc.Addr())
	if n := deliveries("lost-1"); n != 1 {
		t.Fatalf("delivered %d times, want once", n)
	}
	servicetest.WaitFor(t, 5*time.Second, read, map[string]float64{claimOK: 1, endOK: 1, endError: 0})
}
