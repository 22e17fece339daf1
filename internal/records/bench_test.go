package records_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/records"
)

// BenchmarkLifecycle: one job's record from intake to delivered (create,
// claim with the intake revision, finish with a 200 and a small body), as
// intake and the drain write it; reports the bytes JetStream holds per
// record.
func BenchmarkLifecycle(b *testing.B) {
	s := newStore(b, time.Hour)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := "bench-" + strconv.Itoa(i)
		now := time.Now().UTC()
		rev, _, err := s.Create(ctx, api.JobRecord{ID: id, Lane: "demo", State: api.StateQueued, StoredAt: &now})
		if err != nil {
			b.Fatal(err)
		}
		c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Hint: rev, Stored: now, Now: now})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Finish(ctx, c, func(r *api.JobRecord) {
			r.State, r.FinishedAt = api.StateDelivered, &now
			r.Attempts = append(r.Attempts, api.JobAttempt{At: now, Status: 200, DurationMillis: 1.5})
			r.Response = &api.JobResponse{Status: 200, Headers: map[string]string{"Content-Type": "application/json"}, Body: `{"ok":true}`}
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(bytesPerRecord(b, s), "B/record")
}

// BenchmarkDrainWrites: the drain's two writes of a job stored without a
// record (a fresh claim, then the end), 32 jobs at once as a lane's
// deliveries make them; reports the process's CPU per job (client and the
// in-process server), which moves less than the time with a machine's
// load.
func BenchmarkDrainWrites(b *testing.B) {
	s := newStore(b, time.Hour)
	ctx := context.Background()
	var n atomic.Int64
	// Ids of this run: a server of its own (THROTTLER_BENCH_NATS_URL)
	// keeps the records of the runs before.
	run := "d-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	b.SetParallelism(16) // × GOMAXPROCS goroutines
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := run + strconv.FormatInt(n.Add(1), 10)
			now := time.Now().UTC()
			c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Fresh: true, Stored: now, Now: now})
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := s.Finish(ctx, c, func(r *api.JobRecord) {
				r.State, r.FinishedAt = api.StateDelivered, &now
				r.Attempts = append(r.Attempts, api.JobAttempt{At: now, Status: 200, DurationMillis: 1.5})
				r.Response = &api.JobResponse{Status: 200}
			}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if cpu := cpuTime(); cpu0 > 0 && cpu > cpu0 {
		b.ReportMetric(float64(cpu-cpu0)/float64(b.N)/1e3, "cpu-µs/job")
	}
}

// BenchmarkGet: reading a settled job's record.
func BenchmarkGet(b *testing.B) {
	s := newStore(b, time.Hour)
	ctx := context.Background()
	now := time.Now().UTC()
	if _, _, err := s.Create(ctx, api.JobRecord{ID: "j", Lane: "demo", State: api.StateDelivered, StoredAt: &now,
		Response: &api.JobResponse{Status: 200, Body: `{"ok":true}`}}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, _, err := s.Get(ctx, "demo", "j"); err != nil {
			b.Fatal(err)
		}
	}
}

func bytesPerRecord(b *testing.B, s *records.Store) float64 {
	b.Helper()
	n, bytes, err := s.Usage(context.Background(), "demo")
	if err != nil || n == 0 {
		b.Fatalf("usage: %d records, %v", n, err)
	}
	return float64(bytes) / float64(n)
}
