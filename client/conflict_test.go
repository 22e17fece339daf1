package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/ingest"
)

// TestIdempotencyKeyConflict: a 409 idempotency-key-conflict is
// ErrIdempotencyKeyConflict (and ErrInvalid), returned at once without a
// retry; another 409 is not it. The problem type is the server's.
func TestIdempotencyKeyConflict(t *testing.T) {
	if ProblemIdempotencyKeyConflict != ingest.ProblemIdempotencyKeyConflict {
		t.Fatalf("ProblemIdempotencyKeyConflict %q, the server's is %q", ProblemIdempotencyKeyConflict, ingest.ProblemIdempotencyKeyConflict)
	}
	calls := 0
	typ := ProblemIdempotencyKeyConflict
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(api.Problem{Type: typ, Title: "Conflict", Status: http.StatusConflict, Field: "Idempotency-Key", Lane: "demo"})
	}))
	defer srv.Close()
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(context.Background(), "demo", []byte("x"), &SubmitOptions{IdempotencyKey: "order-1"})
	if !errors.Is(err, ErrIdempotencyKeyConflict) || !errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotFound) || calls != 1 {
		t.Fatalf("Submit: %v after %d calls; want ErrIdempotencyKeyConflict at once", err, calls)
	}
	typ = "urn:throttler:problem:job-started"
	if _, err := c.Cancel(context.Background(), "demo", "order-1"); err == nil || errors.Is(err, ErrIdempotencyKeyConflict) {
		t.Fatalf("another 409: %v", err)
	}
}
