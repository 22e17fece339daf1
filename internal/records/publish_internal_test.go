package records

import (
	"context"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

// BenchmarkPublishUnheard: what publishing a settled record costs the
// settling instance when nobody listens: one buffered core NATS publish on
// the results subject (and one more on an allowed reply subject) of the
// bytes the settling write stored, on top of the record's JetStream writes
// (BenchmarkLifecycle).
func BenchmarkPublishUnheard(b *testing.B) {
	srv := testenv.StartNATS(b)
	nc, _ := testenv.JetStream(b, srv.ClientURL())
	s, err := New(nc, nil)
	if err != nil {
		b.Fatal(err)
	}
	replies, err := NewReplies(ReplyRules{Prefixes: []string{"replies"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.EnsureLane(context.Background(), LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, Replies: replies}); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	rec := api.JobRecord{V: api.JobRecordVersion, ID: "order.42", Lane: "demo", State: api.StateDelivered, StoredAt: &now, StartedAt: &now, FinishedAt: &now,
		Attempts: []api.JobAttempt{{At: now, Status: 200, DurationMillis: 1.5}},
		Response: &api.JobResponse{Status: 200, Headers: map[string]string{"Content-Type": "application/json"}, Body: `{"ok":true}`}}
	for _, bc := range []struct {
		name, reply string
	}{{"results", ""}, {"results+reply", "replies.shop.42"}} {
		b.Run(bc.name, func(b *testing.B) {
			r := rec
			r.Reply = bc.reply
			enc, err := encode(r)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				s.publish(r, enc)
			}
			if err := nc.Flush(); err != nil {
				b.Fatal(err)
			}
		})
	}
}
