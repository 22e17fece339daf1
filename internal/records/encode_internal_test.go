package records

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
)

// TestEncoderKnowsWireTypes: the fast encoder knows every field of the
// wire types; a field added to api.JobRecord, JobAttempt or JobResponse
// fails here until appendRecord writes it (until then every record goes
// through encoding/json, nothing is dropped).
func TestEncoderKnowsWireTypes(t *testing.T) {
	if !fastEncode {
		t.Fatal("the wire types have fields appendRecord does not write: add them to appendRecord and wireFields")
	}
}

// TestEncodeIsJSON: encode writes what encoding/json writes, byte for
// byte, for the records the drain and intake write and the odd ones, and
// falls back to it (with its error) for what JSON cannot hold.
func TestEncodeIsJSON(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 8, 0, 0, 123456789, time.UTC)
	t1 := time.Date(2026, 12, 6, 9, 30, 0, 0, time.FixedZone("", 5*3600+30*60))
	t2 := time.Date(1999, 1, 2, 3, 4, 5, 600, time.FixedZone("", -8*3600))
	for _, tc := range []struct {
		name string
		rec  api.JobRecord
		err  bool
	}{
		{name: "zero", rec: api.JobRecord{}},
		{name: "queued", rec: api.JobRecord{ID: "order-1", Lane: "demo", Key: "k", State: api.StateQueued, StoredAt: &t0}},
		{name: "claim", rec: api.JobRecord{ID: "d-1", Lane: "demo", State: api.StateInFlight, StoredAt: &t0, StartedAt: &t0,
			Attempts: []api.JobAttempt{}, Callback: "https://cb.example/x?a=1&b=<2>", Reply: "replies.a", Replays: 2, ReplayedFrom: 18446744073709551615, Owner: "shop"}},
		{name: "delivered", rec: api.JobRecord{ID: "d-1", Lane: "demo", State: api.StateDelivered, StoredAt: &t0, StartedAt: &t1, FinishedAt: &t2,
			Attempts: []api.JobAttempt{{At: t0, Status: 503, DurationMillis: 1.5}, {At: t1, Error: "timeout", DurationMillis: 30000},
				{At: t2, Status: 200, DurationMillis: 0.000123}, {At: t0, DurationMillis: 1e21}, {At: t0, DurationMillis: 0}, {At: t0, DurationMillis: -2.5e-9}},
			Response: &api.JobResponse{Status: 200, Headers: map[string]string{"X-B": "2", "Content-Type": "application/json", "A": "<&>"},
				Body: `{"ok":true,"s":"a\"b\\c"}`, Truncated: true}}},
		{name: "dead with a binary body", rec: api.JobRecord{ID: "x", Lane: "l", State: api.StateDead, Reason: "max attempts\n",
			Response: &api.JobResponse{Status: 500, BodyBase64: "AAEC/w=="}}},
		{name: "escapes", rec: api.JobRecord{ID: "a\x00\x01\x1f\x7f\b\f\t\r\n", Lane: "\u2028\u2029é€𝄞", Key: "bad\xff\xfe utf8\xe2\x82",
			Reason: `"quoted" <tag> & \ back`, State: "odd state"}},
		{name: "owner only", rec: api.JobRecord{ID: "o", Lane: "demo", State: api.StateQueued, Attempts: []api.JobAttempt{}, Owner: "a\"<b>\u2028"}},
		{name: "empty response", rec: api.JobRecord{ID: "e", Response: &api.JobResponse{}}},
		{name: "year out of range", rec: api.JobRecord{ID: "y", StoredAt: ptr(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))}, err: true},
		{name: "NaN duration", rec: api.JobRecord{ID: "n", Attempts: []api.JobAttempt{{At: t0, DurationMillis: math.NaN()}}}, err: true},
		{name: "infinite duration", rec: api.JobRecord{ID: "i", Attempts: []api.JobAttempt{{At: t0, DurationMillis: math.Inf(1)}}}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := encode(tc.rec)
			rec := tc.rec
			rec.V = api.JobRecordVersion
			want, werr := json.Marshal(rec)
			if tc.err {
				if err == nil || werr == nil {
					t.Fatalf("encode = %s, %v; json.Marshal error %v: want both to fail", got, err, werr)
				}
				return
			}
			if err != nil || werr != nil {
				t.Fatalf("encode error %v, json.Marshal error %v", err, werr)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encode:\n%s\njson.Marshal:\n%s", got, want)
			}
			back, err := decode(got)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := encode(back)
			if want2, _ := json.Marshal(back); !bytes.Equal(again, want2) {
				t.Fatalf("after a round trip: encode %s, json.Marshal %s", again, want2)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// FuzzEncode: whatever the strings, durations and times, encode writes
// what encoding/json writes.
func FuzzEncode(f *testing.F) {
	f.Add("id", "lane", "key", "body", "<&>\u2028\xff", 1.5, int64(0), 200)
	f.Add("", "", "", "", "\x00\x1f\"\\", 1e-7, int64(-1e18), 0)
	f.Fuzz(func(t *testing.T, id, lane, key, body, hdr string, ms float64, ns int64, status int) {
		at := time.Unix(0, ns).UTC()
		rec := api.JobRecord{V: api.JobRecordVersion, ID: id, Lane: lane, Key: key, State: api.JobState(hdr), StoredAt: &at,
			Attempts: []api.JobAttempt{{At: at, Status: status, Error: hdr, DurationMillis: ms}},
			Response: &api.JobResponse{Status: status, Headers: map[string]string{hdr: body, key: id}, Body: body, BodyBase64: hdr}, Callback: hdr, Reply: key, Replays: status, ReplayedFrom: uint64(ns), Owner: lane}
		got, err := encode(rec)
		want, werr := json.Marshal(rec)
		if (err != nil) != (werr != nil) || !bytes.Equal(got, want) {
			t.Fatalf("encode = %q, %v; json.Marshal = %q, %v", got, err, want, werr)
		}
	})
}

// BenchmarkEncode: a claim and a delivered job's end, as the drain
// encodes them.
func BenchmarkEncode(b *testing.B) {
	now := time.Now().UTC()
	claim := api.JobRecord{ID: "d-123456", Lane: "demo", State: api.StateInFlight, StoredAt: &now, StartedAt: &now, Attempts: []api.JobAttempt{}}
	end := claim
	end.State, end.FinishedAt = api.StateDelivered, &now
	end.Attempts = []api.JobAttempt{{At: now, Status: 200, DurationMillis: 1.5}}
	end.Response = &api.JobResponse{Status: 200, Headers: map[string]string{"Content-Type": "application/json"}, Body: `{"ok":true}`}
	for _, bc := range []struct {
		name string
		enc  func(api.JobRecord) ([]byte, error)
	}{{"fast", encode}, {"encoding/json", func(r api.JobRecord) ([]byte, error) { return json.Marshal(r) }}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.enc(claim); err != nil {
					b.Fatal(err)
				}
				if _, err := bc.enc(end); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
