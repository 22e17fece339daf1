package queue

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestMsgExpiry: a fetched job's expiry, on times t0…t9 given as values:
// its own Throttle-Expires, its lane's max_age counted from when it entered
// the lane, the earlier of the two, and none once it started (a retry).
func TestMsgExpiry(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	for _, tt := range []struct {
		name     string
		expires  time.Time
		maxAge   time.Duration
		attempts int
		want     time.Time // stored at t0
		expired  []int     // the t_i at which Expired is true
	}{
		{name: "none", expired: nil},
		{name: "own expiry", expires: at(5), want: at(5), expired: []int{5, 6, 9}},
		{name: "max_age", maxAge: 3 * time.Second, want: at(3), expired: []int{3, 4, 9}},
		{name: "max_age first", expires: at(7), maxAge: 3 * time.Second, want: at(3), expired: []int{3, 9}},
		{name: "own expiry first", expires: at(2), maxAge: 3 * time.Second, want: at(2), expired: []int{2, 3}},
		{name: "a retry never expires", expires: at(2), maxAge: time.Second, attempts: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &Msg{job: Job{Expires: tt.expires, Attempts: tt.attempts}, maxAge: tt.maxAge,
				meta: &jetstream.MsgMetadata{Timestamp: t0}}
			if got := m.Expiry(); !got.Equal(tt.want) {
				t.Fatalf("expiry %v, want %v", got, tt.want)
			}
			want := map[int]bool{}
			for _, i := range tt.expired {
				want[i] = true
			}
			for i := range 10 {
				if got := m.Expired(at(i)); got != (want[i] || (len(tt.expired) > 0 && i > tt.expired[0])) {
					t.Errorf("t%d: expired %v", i, got)
				}
			}
		})
	}
}
