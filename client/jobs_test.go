package client_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/client"
)

// TestJobRecordsAgainstServer: Get, Wait and Cancel against a running
// throttler with lanes that keep job records.
func TestJobRecordsAgainstServer(t *testing.T) {
	t.Parallel()
	s := start(t, serverOptions{records: true})
	c := newClient(t, s.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if _, err := c.Submit(ctx, "answers", []byte("x"), &client.SubmitOptions{IdempotencyKey: "a-1"}); err != nil {
		t.Fatal(err)
	}
	rec, err := c.Wait(ctx, "answers", "a-1")
	if err != nil || rec.State != api.StateDelivered || len(rec.Attempts) != 1 || rec.Response == nil || rec.Response.Status != http.StatusOK {
		t.Fatalf("Wait: %+v, %v", rec, err)
	}
	if got, err := c.Get(ctx, "answers", "a-1"); err != nil || got.State != api.StateDelivered {
		t.Fatalf("Get: %+v, %v", got, err)
	}
	if _, err := c.Get(ctx, "answers", "never"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Get of an unknown id: %v, want ErrNotFound", err)
	}

	// The hourly lane starts its first job and holds the second.
	for _, id := range []string{"h-1", "h-2"} {
		if _, err := c.Submit(ctx, "hourly", []byte(id), &client.SubmitOptions{IdempotencyKey: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Wait(ctx, "hourly", "h-1"); err != nil {
		t.Fatal(err)
	}
	rec, err = c.Cancel(ctx, "hourly", "h-2")
	if err != nil || rec.State != api.StateCancelled {
		t.Fatalf("Cancel of a queued job: %+v, %v", rec, err)
	}
	var e *client.Error
	if _, err := c.Cancel(ctx, "hourly", "h-1"); !errors.As(err, &e) || e.StatusCode != http.StatusConflict || e.Problem == nil || e.Problem.Type != "urn:throttler:problem:job-started" {
		t.Fatalf("Cancel of a delivered job: %v, want a 409 *Error", err)
	}
}
