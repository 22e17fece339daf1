package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRecordWritesInit: InitRecordWrites makes the lane's claim and end
// series at 0, ok and error among them, and no other lane's; the waiters
// gauge reads its function at every gather.
func TestRecordWritesInit(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.InitLane("plain")
	m.InitRecordWrites("demo")
	waiting := 3
	m.WatchWaiters(func() int { return waiting })
	got := series(t, reg)
	for _, wr := range [][2]string{
		{RecordClaim, RecordOK}, {RecordClaim, RecordError}, {RecordClaim, RecordOtherOwner}, {RecordClaim, RecordNotStartable},
		{RecordEnd, RecordOK}, {RecordEnd, RecordError},
	} {
		k := "throttler_job_record_writes_total{lane=demo,result=" + wr[1] + ",write=" + wr[0] + "}"
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("%s = %v, %v; want 0", k, v, ok)
		}
	}
	if _, ok := got["throttler_job_record_writes_total{lane=plain,result=error,write=claim}"]; ok {
		t.Errorf("a lane without records has record write series")
	}
	if got["throttler_job_waiters{}"] != 3 {
		t.Errorf("waiters %v, want 3", got["throttler_job_waiters{}"])
	}
	waiting = 0
	if got := series(t, reg)["throttler_job_waiters{}"]; got != 0 {
		t.Errorf("waiters %v after they left, want 0", got)
	}
}
