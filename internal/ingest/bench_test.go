package ingest

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// discardWriter is an http.ResponseWriter that keeps nothing, so that a
// benchmark counts the handler's allocations, not a recorder's.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

// BenchmarkSubmit: one POST /v1/lanes/{lane}/jobs through the handler on
// fakes (no network, no JetStream): what intake itself costs per job.
//
//	go test -run '^$' -bench 'Submit' -benchmem ./internal/ingest/
func BenchmarkSubmit(b *testing.B) {
	f := newFixture(b, nil)
	body := []byte(`{"event":"bench.ingest","customer":"c-0001","amount":4200,"ok":1}`)
	req := httptest.NewRequest("POST", "/v1/lanes/demo/jobs", nil)
	req.Host = "localhost:8080"
	req.RemoteAddr = "127.0.0.1:5555"
	req.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r := req.Clone(req.Context())
		r.Body = http.NoBody
		r.Body = nopCloser{bytes.NewReader(body)}
		r.ContentLength = int64(len(body))
		w := &discardWriter{h: http.Header{}}
		f.h.ServeHTTP(w, r)
		if w.code != http.StatusAccepted {
			b.Fatalf("status %d", w.code)
		}
	}
}

// BenchmarkSubmitBatch: a batch of 100 jobs through the handler on fakes.
func BenchmarkSubmitBatch(b *testing.B) { benchmarkSubmitBatch(b, false) }

// BenchmarkSubmitBatchKeys: the same with an idempotency_key per item, as
// throttler-bench's batches (and most callers) send them.
func BenchmarkSubmitBatchKeys(b *testing.B) { benchmarkSubmitBatch(b, true) }

func benchmarkSubmitBatch(b *testing.B, keys bool) {
	f := newFixture(b, nil)
	var buf bytes.Buffer
	buf.WriteString("[")
	for i := range 100 {
		if i > 0 {
			buf.WriteString(",")
		}
		buf.WriteString(`{`)
		if keys {
			buf.WriteString(`"idempotency_key":"8MvCk0Yuzf5cGgvKEaxSWd-b-` + strconv.Itoa(1000+i) + `",`)
		}
		buf.WriteString(`"payload":{"event":"bench.ingest","customer":"c-0001","amount":4200,"ok":1}}`)
	}
	buf.WriteString("]")
	body := buf.Bytes()
	req := httptest.NewRequest("POST", "/v1/lanes/demo/jobs:batch", nil)
	req.Host = "localhost:8080"
	req.RemoteAddr = "127.0.0.1:5555"
	req.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r := req.Clone(req.Context())
		r.Body = nopCloser{bytes.NewReader(body)}
		r.ContentLength = int64(len(body))
		w := &discardWriter{h: http.Header{}}
		f.h.ServeHTTP(w, r)
		if w.code != http.StatusAccepted {
			b.Fatalf("status %d", w.code)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/job")
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }
