package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/throttler/throttler/api"
)

// TestThrottleKeyAndItsDeprecatedName: SubmitOptions.ThrottleKey sends the
// Throttle-Key header, as api.BatchItem.ThrottleKey does for an item; the
// deprecated Key still does, and ThrottleKey wins when both are set. The
// answer's state is typed (api.JobState).
func TestThrottleKeyAndItsDeprecatedName(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Throttle-Key"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(api.Accepted{ID: "x", Lane: "hooks", State: api.StateQueued})
	}))
	defer srv.Close()
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []SubmitOptions{{ThrottleKey: "new"}, {Key: "old"}, {ThrottleKey: "new", Key: "old"}} {
		a, err := c.Submit(context.Background(), "hooks", []byte("x"), &o)
		if err != nil {
			t.Fatal(err)
		}
		var s api.JobState = a.State
		if s != api.StateQueued {
			t.Errorf("state %q", s)
		}
	}
	if want := []string{"new", "old", "new"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("Throttle-Key headers %q, want %q", got, want)
	}
}

// TestSubmitCallback: SubmitOptions.Callback sends Throttle-Callback; none
// sends no header.
func TestSubmitCallback(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Throttle-Callback"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(api.Accepted{ID: "x", Lane: "geo", State: api.StateQueued})
	}))
	defer srv.Close()
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []*SubmitOptions{{Callback: "https://app.example.com/cb/1"}, nil} {
		if _, err := c.Submit(context.Background(), "geo", []byte("x"), o); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != "https://app.example.com/cb/1" || got[1] != "" {
		t.Fatalf("Throttle-Callback sent: %q", got)
	}
}
