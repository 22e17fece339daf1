package apiserver

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/lane"
)

func TestKeyChange(t *testing.T) {
	t.Parallel()
	rate, err := bucket.ParseRate("120/min")
	if err != nil {
		t.Fatal(err)
	}
	burst, inflight, weight, paused := 3, 4, 2.5, true
	got := keyChange(ingest.KeyChange{Rate: &rate, Burst: &burst, MaxInflight: &inflight, Weight: &weight, Paused: &paused, Reset: true})
	two := 2.0
	want := lane.KeyChange{Rate: &two, Burst: &burst, MaxInflight: &inflight, Weight: &weight, Paused: &paused, Reset: true}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("keyChange = %+v, want %+v (rate %v/s)", got, want, *got.Rate)
	}
	if got := keyChange(ingest.KeyChange{}); !reflect.DeepEqual(got, lane.KeyChange{}) {
		t.Fatalf("an empty change became %+v", got)
	}
}

func TestKeyErr(t *testing.T) {
	t.Parallel()
	if err := keyErr(fmt.Errorf("lane demo: %w", lane.ErrNotKeyed)); !errors.Is(err, ingest.ErrNotKeyed) {
		t.Fatalf("a lane that is not keyed: %v, want ingest.ErrNotKeyed", err)
	}
	other := errors.New("boom")
	if err := keyErr(other); err != other {
		t.Fatalf("another error became %v", err)
	}
	if err := keyErr(nil); err != nil {
		t.Fatalf("nil became %v", err)
	}
}

func TestLanesUnknown(t *testing.T) {
	t.Parallel()
	d := NewLanes()
	if _, ok := d.Lane("nope"); ok {
		t.Fatal("an empty directory found a lane")
	}
	if _, err := d.SetLimit(t.Context(), "nope", 1, 1); err == nil {
		t.Fatal("SetLimit of an unknown lane succeeded")
	}
	if st := d.Status(t.Context()); st == nil || len(st) != 0 {
		t.Fatalf("Status of no lanes = %#v, want an empty list", st)
	}
}
