package records

import (
	"strings"
	"testing"
)

// TestReadPubAck: a stream's answer to a write, the common one read
// without reflection, the rest by encoding/json; a refusal gives its code,
// an answer that is not one an error.
func TestReadPubAck(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		seq      uint64
		code     int
		err      bool
	}{
		{name: "stored", in: `{"stream":"KV_THROTTLE_RECORDS_demo","seq":42}`, seq: 42},
		{name: "stored with a domain", in: `{"stream":"KV_x","seq":7,"domain":"hub"}`, seq: 7},
		{name: "fields in another order", in: `{"seq":9,"stream":"KV_x"}`, seq: 9},
		{name: "wrong last sequence", in: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}`, code: 10071},
		{name: "wrong last sequence after a stream", in: `{"stream":"KV_x","seq":0,"error":{"code":400,"err_code":10164,"description":"wrong last sequence"}}`, code: 10164},
		{name: "an error without a code", in: `{"error":{"code":503,"description":"unavailable"}}`, err: true},
		{name: "no sequence", in: `{"stream":"KV_x"}`, err: true},
		{name: "sequence 0", in: `{"stream":"KV_x","seq":0}`, err: true},
		{name: "no stream", in: `{"seq":3}`, err: true},
		{name: "cut short", in: `{"stream":"KV_x","seq":12`, err: true},
		{name: "not JSON", in: `+OK`, err: true},
		{name: "empty", in: ``, err: true},
		{name: "too long", in: `{"stream":"KV_x","seq":1,"pad":"` + strings.Repeat("x", maxPubAck) + `"}`, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seq, code, err := readPubAck([]byte(tc.in))
			if (err != nil) != tc.err || seq != tc.seq || code != tc.code {
				t.Fatalf("readPubAck(%.60q) = %d, %d, %v; want %d, %d, error %v", tc.in, seq, code, err, tc.seq, tc.code, tc.err)
			}
		})
	}
}
