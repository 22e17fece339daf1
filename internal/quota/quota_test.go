package quota_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/quotatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemory(t *testing.T) {
	quotatest.Run(t, func(_ *testing.T, c *clock.Manual) quota.Limiter { return &quota.Memory{Clock: c} })
}

func TestSlide(t *testing.T) {
	w := quota.Window{Limit: 10, Length: 10 * time.Second}
	for _, tc := range []struct {
		name      string
		elapsed   time.Duration
		prev, cur int64
		allowed   bool
		remaining int64
		retry     time.Duration
	}{
		{"empty", 0, 0, 0, true, 9, 0},
		{"last fits", 0, 0, 9, true, 0, 0},
		{"full, prev empty: next window", 2 * time.Second, 0, 10, false, 0, 8*time.Second + time.Second},
		{"prev weighs all at start", 0, 10, 0, false, 0, time.Second},
		{"prev half gone", 5 * time.Second, 10, 0, true, 4, 0},
		{"prev and cur", 5 * time.Second, 10, 5, false, 0, 1 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := quota.Slide(tc.elapsed, tc.prev, tc.cur, w, 1)
			if d.Allowed != tc.allowed || d.Remaining != tc.remaining || d.RetryAfter != tc.retry {
				t.Fatalf("%+v, want allowed=%v remaining=%d retry=%v", d, tc.allowed, tc.remaining, tc.retry)
			}
		})
	}
}

// TestAdmitNOne: AdmitN with n = 1 is Admit, step by step.
func TestAdmitNOne(t *testing.T) {
	l := bucket.Limit{Rate: 3, Burst: 4}
	t0 := time.Unix(1000, 0)
	var a, b time.Time
	for i := range 40 {
		now := t0.Add(time.Duration(i) * 97 * time.Millisecond)
		da, na := bucket.Admit(now, a, l)
		db, nb := bucket.AdmitN(now, b, l, 1)
		if da != db || !na.Equal(nb) {
			t.Fatalf("step %d: Admit %+v %v, AdmitN %+v %v", i, da, na, db, nb)
		}
		a, b = na, nb
	}
}

func TestValidate(t *testing.T) {
	for _, w := range []quota.Window{{Limit: -1, Length: time.Minute}, {Limit: 1, Length: 0}, {Limit: 1, Length: 1500 * time.Millisecond}, {Limit: 1, Length: 48 * time.Hour}} {
		if err := w.Validate(); !errors.Is(err, bucket.ErrInvalidLimit) {
			t.Errorf("%+v: %v", w, err)
		}
	}
	_, err := (&quota.Memory{}).Check(context.Background(), quota.Request{Caller: "c", Plan: bucket.Limit{Rate: 1, Burst: 2}, Cost: 3})
	if !errors.Is(err, quota.ErrCostOverBurst) {
		t.Fatalf("cost over burst: %v", err)
	}
}

type failing struct{ err error }

func (f failing) Check(context.Context, quota.Request) (quota.Result, error) {
	return quota.Result{}, f.err
}

// TestFailover: an unavailable primary is answered from memory and
// reported; an invalid request is not.
func TestFailover(t *testing.T) {
	var heard int
	f := &quota.Failover{Primary: failing{bucket.ErrUnavailable}, Local: &quota.Memory{}, OnFallback: func(error) { heard++ }}
	r := quota.Request{Caller: "key:a", Plan: bucket.Limit{Rate: 1, Burst: 1}, Cost: 1}
	if res, err := f.Check(context.Background(), r); err != nil || !res.Plan.Allowed || heard != 1 {
		t.Fatalf("%+v %v heard %d", res, err, heard)
	}
	if res, _ := f.Check(context.Background(), r); res.Plan.Allowed {
		t.Fatal("the local state did not hold")
	}
	f.Primary = failing{errors.New("bad")}
	if _, err := f.Check(context.Background(), r); err == nil || heard != 2 {
		t.Fatalf("%v heard %d", err, heard)
	}
}

func TestUsage(t *testing.T) {
	var u quota.Usage
	t0 := time.Unix(6000, 0)
	for i := range 30 {
		u.Add("free", "key:a", 1, t0.Add(time.Duration(i)*time.Second))
	}
	u.Add("free", "key:b", 10, t0.Add(29*time.Second))
	used, callers := u.Used("free", t0.Add(29*time.Second))
	if used != 40 || callers != 2 {
		t.Fatalf("used %v callers %d", used, callers)
	}
	if got := quota.Utilization(used, callers, 1); got != 40.0/120 {
		t.Fatalf("utilization %v", got)
	}
	used, callers = u.Used("free", t0.Add(89*time.Second))
	if used != 0 || callers != 0 {
		t.Fatalf("a minute later: used %v callers %d", used, callers)
	}
}
