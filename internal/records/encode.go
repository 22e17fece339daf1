package records

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/jsonenc"
)

// encode is a record in its wire format: what encoding/json makes of
// api.JobRecord, byte for byte (TestEncodeIsJSON, FuzzEncode), written
// without reflection. The drain encodes twice per job (its claim and its
// end) and json.Marshal was a tenth of the CPU of both writes
// (BenchmarkDrainWrites). A record the fast path cannot write as
// encoding/json would (a time outside RFC 3339, a NaN duration) and any
// record when the wire types have fields this file does not know
// (fastEncode) go through json.Marshal.
func encode(rec api.JobRecord) ([]byte, error) {
	rec.V = api.JobRecordVersion
	if fastEncode {
		if b, ok := appendRecord(make([]byte, 0, 256+recordLen(rec)), &rec); ok {
			return b, nil
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("records: encode %s/%s: %w", rec.Lane, rec.ID, err)
	}
	return b, nil
}

// recordLen is about the bytes rec's strings take.
func recordLen(rec api.JobRecord) int {
	n := len(rec.ID) + len(rec.Lane) + len(rec.Key) + len(rec.Reason) + len(rec.Callback) + len(rec.Reply) + len(rec.Owner) + 64*len(rec.Attempts)
	if r := rec.Response; r != nil {
		n += len(r.Body) + len(r.BodyBase64) + 64*len(r.Headers)
	}
	return n
}

// wireFields are the JSON fields of the wire types appendRecord writes,
// in their order: a field added to one of them and not here turns the
// fast path off (encoding/json then writes every record) instead of
// dropping the field.
var wireFields = map[reflect.Type][]string{
	reflect.TypeFor[api.JobRecord](): {"v", "id", "lane", "key,omitempty", "state", "stored_at,omitempty", "started_at,omitempty",
		"finished_at,omitempty", "attempts", "reason,omitempty", "response,omitempty", "callback,omitempty", "reply,omitempty",
		"replays,omitempty", "replayed_from,omitempty", "owner,omitempty"},
	reflect.TypeFor[api.JobAttempt]():  {"at", "status,omitempty", "error,omitempty", "duration_ms"},
	reflect.TypeFor[api.JobResponse](): {"status", "headers,omitempty", "body,omitempty", "body_base64,omitempty", "truncated,omitempty"},
}

// fastEncode: the wire types are the ones appendRecord knows.
var fastEncode = knowsWireTypes()

func knowsWireTypes() bool {
	for t, want := range wireFields {
		var got []string
		for f := range t.Fields() {
			got = append(got, f.Tag.Get("json"))
		}
		if !slices.Equal(got, want) {
			return false
		}
	}
	return true
}

// appendRecord appends rec as encoding/json writes it; ok is false when
// it cannot (then encoding/json says why).
func appendRecord(b []byte, rec *api.JobRecord) (_ []byte, ok bool) {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(rec.V), 10)
	b = append(b, `,"id":`...)
	b = jsonenc.AppendString(b, rec.ID)
	b = append(b, `,"lane":`...)
	b = jsonenc.AppendString(b, rec.Lane)
	if rec.Key != "" {
		b = append(b, `,"key":`...)
		b = jsonenc.AppendString(b, rec.Key)
	}
	b = append(b, `,"state":`...)
	b = jsonenc.AppendString(b, string(rec.State))
	for _, t := range []struct {
		name string
		at   *time.Time
	}{{`,"stored_at":`, rec.StoredAt}, {`,"started_at":`, rec.StartedAt}, {`,"finished_at":`, rec.FinishedAt}} {
		if t.at == nil {
			continue
		}
		b = append(b, t.name...)
		if b, ok = appendTime(b, *t.at); !ok {
			return nil, false
		}
	}
	b = append(b, `,"attempts":`...)
	if rec.Attempts == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, a := range rec.Attempts {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendAttempt(b, a); !ok {
				return nil, false
			}
		}
		b = append(b, ']')
	}
	if rec.Reason != "" {
		b = append(b, `,"reason":`...)
		b = jsonenc.AppendString(b, rec.Reason)
	}
	if r := rec.Response; r != nil {
		b = append(b, `,"response":`...)
		b = appendResponse(b, r)
	}
	if rec.Callback != "" {
		b = append(b, `,"callback":`...)
		b = jsonenc.AppendString(b, rec.Callback)
	}
	if rec.Reply != "" {
		b = append(b, `,"reply":`...)
		b = jsonenc.AppendString(b, rec.Reply)
	}
	if rec.Replays != 0 {
		b = append(b, `,"replays":`...)
		b = strconv.AppendInt(b, int64(rec.Replays), 10)
	}
	if rec.ReplayedFrom != 0 {
		b = append(b, `,"replayed_from":`...)
		b = strconv.AppendUint(b, rec.ReplayedFrom, 10)
	}
	if rec.Owner != "" {
		b = append(b, `,"owner":`...)
		b = jsonenc.AppendString(b, rec.Owner)
	}
	return append(b, '}'), true
}

func appendAttempt(b []byte, a api.JobAttempt) (_ []byte, ok bool) {
	b = append(b, `{"at":`...)
	if b, ok = appendTime(b, a.At); !ok {
		return nil, false
	}
	if a.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(a.Status), 10)
	}
	if a.Error != "" {
		b = append(b, `,"error":`...)
		b = jsonenc.AppendString(b, a.Error)
	}
	b = append(b, `,"duration_ms":`...)
	if b, ok = appendFloat(b, a.DurationMillis); !ok {
		return nil, false
	}
	return append(b, '}'), true
}

func appendResponse(b []byte, r *api.JobResponse) []byte {
	b = append(b, `{"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	if len(r.Headers) > 0 {
		b = append(b, `,"headers":{`...)
		keys := make([]string, 0, len(r.Headers))
		for k := range r.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys) // encoding/json sorts a map's keys
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonenc.AppendString(b, k)
			b = append(b, ':')
			b = jsonenc.AppendString(b, r.Headers[k])
		}
		b = append(b, '}')
	}
	if r.Body != "" {
		b = append(b, `,"body":`...)
		b = jsonenc.AppendString(b, r.Body)
	}
	if r.BodyBase64 != "" {
		b = append(b, `,"body_base64":`...)
		b = jsonenc.AppendString(b, r.BodyBase64)
	}
	if r.Truncated {
		b = append(b, `,"truncated":true`...)
	}
	return append(b, '}')
}

// appendTime is time.Time's MarshalJSON; ok is false for a time RFC 3339
// cannot hold.
func appendTime(b []byte, t time.Time) (_ []byte, ok bool) {
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return nil, false
	}
	return append(b, '"'), true
}

// appendFloat is encoding/json's float64 (ES6 number formatting); ok is
// false for NaN and the infinities, which JSON cannot hold.
func appendFloat(b []byte, f float64) (_ []byte, ok bool) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 becomes e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}
