package dispatch

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/throttler/throttler/internal/dest"
)

// BenchmarkPrepare is the per-delivery cost before the round trip: a plain
// job against one with a Throttle-Path and two forwarded headers, checked
// against the lane's lists as a job from the public NATS subject is.
// throttler-bench --only drain measures the same difference end to end.
// Besides ns/op it reports cpu-ns/op, the CPU time of the benchmark's own
// thread per op (the collector's background work left out), which the
// neighbours' load on a shared machine moves much less than ns/op.
func BenchmarkPrepare(b *testing.B) {
	h, err := NewHTTP(HTTPConfig{
		URL:            "https://api.example.com/v1/base",
		Methods:        []string{"POST", "PUT"},
		ForwardHeaders: []string{"Authorization", "X-Request-Id"},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"n":1}`)
	for _, c := range []struct {
		name string
		dest dest.Request
	}{
		{"plain", dest.Request{}},
		{"path+2headers", dest.Request{Path: "orders/42/items?expand=all", Headers: map[string]string{"Authorization": "Bearer abc", "X-Request-Id": "r-1"}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			job := Job{ID: "job-1", Payload: payload, Dest: c.dest}
			ctx := context.Background()
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU(b)
			for b.Loop() {
				if _, _, _, res := h.prepare(ctx, job); res.Err != nil {
					b.Fatal(res.Err)
				}
			}
			b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkDeliver is one whole delivery to a server in this process (the
// server's parsing of the request counts too): a plain job against one
// with a Throttle-Path and two forwarded headers, as the destination row
// of throttler-bench --only drain sends them.
func BenchmarkDeliver(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	h, err := NewHTTP(HTTPConfig{
		URL:            srv.URL + "/hook",
		Methods:        []string{"POST", "GET"},
		ForwardHeaders: []string{"X-Api-Key", "Accept"},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	payload := []byte(`{"event":"bench.drain","customer":"c-0001","amount":4200,"ok":1}`)
	for _, c := range []struct {
		name string
		dest dest.Request
	}{
		{"plain", dest.Request{}},
		{"path+2headers", dest.Request{Path: "items/42?page=2", Headers: map[string]string{"X-Api-Key": "k-0123456789abcdef", "Accept": "application/json"}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			job := Job{ID: "job-1", Payload: payload, Dest: c.dest}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if res := h.Deliver(ctx, job); res.Err != nil {
					b.Fatal(res.Err)
				}
			}
		})
	}
}
