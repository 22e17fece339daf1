package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixedBacklog struct {
	n   int64
	err error
}

func (f *fixedBacklog) Backlog(context.Context, string, time.Duration) (int64, error) {
	return f.n, f.err
}

type downStore struct{ bucket.Store }

func (downStore) Admit(context.Context, bucket.Key, bucket.Limit) (bucket.Decision, error) {
	return bucket.Decision{}, bucket.ErrUnavailable
}

func TestDecide(t *testing.T) {
	ctx := context.Background()
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 20, Burst: 10}, MaxBacklog: 100, MaxWait: 3 * time.Second}
	clock := buckettest.NewClock()
	backlog := &fixedBacklog{}
	a, err := admission.New(admission.Config{Store: &bucket.Memory{Clock: clock}, Backlog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	// t0: ten admitted, the eleventh queued with an ETA of one period.
	for i := 0; i < 10; i++ {
		d, err := a.Decide(ctx, lane, "")
		if err != nil || d.State != admission.Admitted || d.Remaining != 9-i {
			t.Fatalf("job %d: %+v %v", i, d, err)
		}
	}
	d, err := a.Decide(ctx, lane, "")
	if err != nil || d.State != admission.Queued || d.ETA != 50*time.Millisecond {
		t.Fatalf("job 11: %+v %v, want queued with ETA 50ms", d, err)
	}
	// A backlog of 40 jobs: the ETA is their drain time.
	backlog.n = 40
	if d, _ := a.Decide(ctx, lane, ""); d.State != admission.Queued || d.ETA != 2*time.Second {
		t.Fatalf("with 40 waiting: %+v, want queued, ETA 2s", d)
	}
	// 61 waiting: 3.05 s > max_wait 3 s.
	backlog.n = 61
	_, err = a.Decide(ctx, lane, "")
	var rej *admission.RejectError
	if !errors.As(err, &rej) || !errors.Is(err, admission.ErrBacklogFull) || rej.Field != "max_wait" || rej.RetryAfter != 50*time.Millisecond {
		t.Fatalf("over max_wait: %v", err)
	}
	// 100 waiting: at max_backlog; Retry-After is the time for one to leave.
	lane.MaxWait = 0
	backlog.n = 100
	_, err = a.Decide(ctx, lane, "")
	if !errors.As(err, &rej) || rej.Field != "max_backlog" || rej.RetryAfter != 50*time.Millisecond {
		t.Fatalf("at max_backlog: %v", err)
	}
}

func TestStoreDownQueues(t *testing.T) {
	a, _ := admission.New(admission.Config{Store: downStore{}, Backlog: &fixedBacklog{n: 3}})
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 10, Burst: 5}, MaxBacklog: 10}
	d, err := a.Decide(context.Background(), lane, "")
	if err != nil || d.State != admission.Queued || !d.Degraded || d.ETA != 300*time.Millisecond {
		t.Fatalf("store down: %+v %v, want degraded queued, ETA 300ms", d, err)
	}
}

func TestBacklogUnknownStillDecides(t *testing.T) {
	a, _ := admission.New(admission.Config{Store: &bucket.Memory{}, Backlog: &fixedBacklog{err: errors.New("nats away")}})
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 10, Burst: 1}, MaxBacklog: 10}
	if d, err := a.Decide(context.Background(), lane, ""); err != nil || d.State != admission.Admitted {
		t.Fatalf("%+v %v", d, err)
	}
}
