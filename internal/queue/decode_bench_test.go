package queue

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// BenchmarkDecodePublic is what the drain's reader does with one job
// published on a lane's public subject before the job is handed on: nats.go
// decodes the message's header block (as it does on its read loop for every
// message with headers), then the queue reads the job and its schedule from
// them. A plain job (no headers) against one with a Throttle-Path and two
// Throttle-Forward headers, as throttler-bench --only drain publishes them.
//
//	go test -run '^$' -bench DecodePublic -benchmem ./internal/queue/
func BenchmarkDecodePublic(b *testing.B) {
	payload := []byte(`{"event":"bench.drain","customer":"c-0001","amount":4200,"ok":1}`)
	withDest := "NATS/1.0\r\nThrottle-Path: items/42?page=2\r\nThrottle-Forward-X-Api-Key: k-0123456789abcdef\r\nThrottle-Forward-Accept: application/json\r\n\r\n"
	now := time.Now()
	for _, c := range []struct {
		name string
		hdr  []byte
	}{{"plain", nil}, {"path+2headers", []byte(withDest)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var h nats.Header
				if c.hdr != nil {
					var err error
					if h, err = nats.DecodeHeadersMsg(c.hdr); err != nil {
						b.Fatal(err)
					}
				}
				job := decodeJob("demo", h, payload, "", 42, false, now)
				applyPublicSchedule(&job, h, now, 0)
				if c.hdr != nil && job.Dest.Path == "" {
					b.Fatal("no path")
				}
			}
		})
	}
}
