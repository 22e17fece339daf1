package ingest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/throttler/throttler/api"
)

// TestWriteAnswerPassesKeptHeaders: a waited answer carries the target's
// headers its record kept (results.headers), but never one the answer sets
// itself or must not take from a target.
func TestWriteAnswerPassesKeptHeaders(t *testing.T) {
	w := httptest.NewRecorder()
	w.Header().Set("Location", "/v1/lanes/geo/jobs/a1")
	w.Header().Set("Ratelimit", `"geo";r=0;t=1`)
	writeAnswer(w, api.JobRecord{ID: "a1", Lane: "geo", State: api.StateDelivered, Response: &api.JobResponse{
		Status: 201,
		Headers: map[string]string{
			"Content-Type": "application/json", "X-Request-Id": "geo-a1", "Etag": `"v7"`,
			"Location": "/elsewhere", "Set-Cookie": "s=1", "Content-Security-Policy": "default-src *",
			"Ratelimit": "target's", "Throttle-Job-State": "dead", "Content-Encoding": "gzip", "Connection": "close",
		},
		Body: `{"ok":true}`,
	}})
	h := w.Result().Header
	for name, want := range map[string]string{
		"X-Request-Id": "geo-a1", "Etag": `"v7"`, // kept: passed on
		"Location": "/v1/lanes/geo/jobs/a1", "Ratelimit": `"geo";r=0;t=1`, "Content-Security-Policy": "sandbox",
		"Throttle-Job-State": "delivered", "Throttle-Target-Status": "201", "Content-Type": "application/json",
		"Set-Cookie": "", "Content-Encoding": "", "Connection": "",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if w.Code != http.StatusOK || w.Body.String() != `{"ok":true}` {
		t.Fatalf("answer %d %q", w.Code, w.Body)
	}
}
