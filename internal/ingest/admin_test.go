package ingest

import (
	"context"
	"encoding/json"
	"github.com/throttler/throttler/api"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
)

// limitDir is a Directory with one lane, "demo", at 20/s burst 10; it
// records the limit it is given.
type limitDir struct {
	rate  float64
	burst int
	calls int
}

func (d *limitDir) Lane(name string) (Lane, bool) {
	return Lane{Admission: admission.Lane{Name: name, Limit: bucket.Limit{Rate: 20, Burst: 10}}}, name == "demo"
}

func (d *limitDir) Status(context.Context) []api.LaneStatus { return nil }

func (d *limitDir) SetLimit(_ context.Context, name string, rate float64, burst int) (api.LaneStatus, error) {
	d.rate, d.burst = rate, burst
	d.calls++
	return api.LaneStatus{Name: name, Rate: rate, Burst: burst}, nil
}

// TestSetLimitRateForms: PATCH takes rate as a number of jobs per second
// or as a string in the config's rate syntax, and names the field it
// refuses.
func TestSetLimitRateForms(t *testing.T) {
	steps := []struct {
		body  string
		rate  float64 // the rate set, when accepted
		burst int
		field string // the problem's field, when refused
	}{
		{`{"rate": 50}`, 50, 10, ""},
		{`{"rate": 0.5}`, 0.5, 10, ""},
		{`{"rate": "50/s"}`, 50, 10, ""},
		{`{"rate": "120/min"}`, 2, 10, ""},
		{`{"rate": " 5 / m ", "burst": 3}`, 5.0 / 60, 3, ""},
		{`{"burst": 3}`, 20, 3, ""},
		{`{"rate": "fast"}`, 0, 0, "rate"},
		{`{"rate": "20/w"}`, 0, 0, "rate"},
		{`{"rate": -1}`, 0, 0, "rate"},
		{`{"rate": 0}`, 0, 0, "rate"},
		{`{"rate": "2000000/s"}`, 0, 0, "rate"},
		{`{"rate": "0.000001"}`, 0, 0, "rate"}, // burst 10 at this rate: over 100 days to refill
		{`{"rate": "1/d", "burst": 1000000}`, 0, 0, "burst"},
		{`{"burst": 0}`, 0, 0, "burst"},
		{`{"rate": true}`, 0, 0, "rate"},
		{`{"rate": [1]}`, 0, 0, "rate"},
		{`{}`, 0, 0, "body"},
		{`{"rat": 5}`, 0, 0, "body"},
	}
	for _, s := range steps {
		t.Run(s.body, func(t *testing.T) {
			dir := &limitDir{}
			h := &Handler{cfg: Config{Lanes: dir, Logger: slog.New(slog.DiscardHandler)}}
			req := httptest.NewRequest("PATCH", "/v1/lanes/demo", strings.NewReader(s.body))
			req.SetPathValue("lane", "demo")
			rec := httptest.NewRecorder()
			h.admin(h.setLimit).ServeHTTP(rec, req)
			if s.field == "" {
				if rec.Code != 200 || dir.calls != 1 || dir.rate != s.rate || dir.burst != s.burst {
					t.Fatalf("status %d, SetLimit called %d times with %v/s burst %d; want %v/s burst %d: %s", rec.Code, dir.calls, dir.rate, dir.burst, s.rate, s.burst, rec.Body)
				}
				return
			}
			var p struct {
				Field  string `json:"field"`
				Detail string `json:"detail"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != 400 || p.Field != s.field || dir.calls != 0 {
				t.Fatalf("status %d, field %q (%v), SetLimit called %d times; want 400 naming %q: %s", rec.Code, p.Field, err, dir.calls, s.field, rec.Body)
			}
			t.Logf("%s", p.Detail)
		})
	}
}
