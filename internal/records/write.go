package records

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errWrongLast: the compare-and-set of a write lost (the record's revision
// is not the one expected, or for a create, the record exists).
var errWrongLast = errors.New("records: wrong last revision")

// put writes b as the record of id in lane's bucket at revision rev (0:
// create-if-absent) and returns the new revision; errWrongLast when the
// compare-and-set lost.
//
// Every write of a record but Undo's purge goes through it. It is the
// bucket's own write (a publish on the key's subject with
// Nats-Expected-Last-Subject-Sequence, as jetstream.KeyValue.Update sends
// it), made directly: the drain writes twice per job, and the library's
// decoding of the stream's answer was a third of the client's side of a
// write. The answer is read by readPubAck; an answer
// it does not know goes through encoding/json. A stream that does not
// answer (a leader election) and a create over a delete or purge marker
// take the library's path, which handles both.
func (s *Store) put(ctx context.Context, kv jetstream.KeyValue, lane, id string, b []byte, rev uint64) (uint64, error) {
	m := &nats.Msg{Subject: "$KV." + BucketName(lane) + "." + Key(id), Data: b,
		Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(rev, 10)}}}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultTimeout)
		defer cancel()
	}
	resp, err := s.nc.RequestMsgWithContext(ctx, m)
	if errors.Is(err, nats.ErrNoResponders) {
		return s.putSlow(ctx, kv, id, b, rev)
	}
	if err != nil {
		return 0, err
	}
	seq, code, err := readPubAck(resp.Data)
	switch {
	case err != nil:
		return 0, err
	case code == 0:
		return seq, nil
	case isWrongLastCode(code) && rev == 0:
		// The key may hold a delete or purge marker (an undone create):
		// the library's create writes over it.
		return s.putSlow(ctx, kv, id, b, rev)
	case isWrongLastCode(code):
		return 0, errWrongLast
	}
	return 0, fmt.Errorf("records: JetStream refused the write (error %d)", code)
}

// putSlow is put through the library.
func (s *Store) putSlow(ctx context.Context, kv jetstream.KeyValue, id string, b []byte, rev uint64) (uint64, error) {
	var seq uint64
	var err error
	if rev == 0 {
		seq, err = kv.Create(ctx, Key(id), b)
	} else {
		seq, err = kv.Update(ctx, Key(id), b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongLast(err) {
		return 0, errWrongLast
	}
	return seq, err
}

// isWrongLastCode reports JetStream's refusal of a compare-and-set: 10071,
// or 10164 from a replicated stream.
func isWrongLastCode(code int) bool {
	return code == int(jetstream.JSErrCodeStreamWrongLastSequence) || code == 10164
}

// defaultTimeout bounds a write whose context has no deadline (the
// library's default for a publish).
const defaultTimeout = 5 * time.Second

// maxPubAck bounds a stream's answer to a write.
const maxPubAck = 4096

// readPubAck reads a stream's answer to a publish: the stored sequence, or
// the error code of a refusal. The common answer, {"stream":"…","seq":N},
// is read without reflection; anything else by encoding/json.
func readPubAck(b []byte) (seq uint64, code int, err error) {
	if len(b) > maxPubAck {
		return 0, 0, fmt.Errorf("records: an answer of %d bytes to a write", len(b))
	}
	const seqKey = `,"seq":`
	if bytes.HasPrefix(b, []byte(`{"stream":"`)) && !bytes.Contains(b, []byte(`"error"`)) {
		if i := bytes.Index(b, []byte(seqKey)); i > 0 {
			rest := b[i+len(seqKey):]
			n := 0
			for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
				n++
			}
			if n > 0 && n < len(rest) && (rest[n] == '}' || rest[n] == ',') {
				if v, err := strconv.ParseUint(string(rest[:n]), 10, 64); err == nil && v > 0 {
					return v, 0, nil
				}
			}
		}
	}
	var ack struct {
		Error *struct {
			Code    int    `json:"code"`
			ErrCode int    `json:"err_code"`
			Desc    string `json:"description"`
		} `json:"error"`
		Stream string `json:"stream"`
		Seq    uint64 `json:"seq"`
	}
	if err := json.Unmarshal(b, &ack); err != nil {
		return 0, 0, fmt.Errorf("records: the answer to a write: %w", err)
	}
	switch {
	case ack.Error != nil && ack.Error.ErrCode != 0:
		return 0, ack.Error.ErrCode, nil
	case ack.Error != nil:
		return 0, 0, fmt.Errorf("records: JetStream refused the write: %d %s", ack.Error.Code, ack.Error.Desc)
	case ack.Stream == "" || ack.Seq == 0:
		return 0, 0, fmt.Errorf("records: an answer to a write without a stream or sequence: %q", b)
	}
	return ack.Seq, 0, nil
}
