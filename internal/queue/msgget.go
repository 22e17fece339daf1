package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// msgGetTimeout bounds a message get whose context has no deadline (as
// the JetStream client's default does).
const msgGetTimeout = 5 * time.Second

// leaderGet reads the message seq of stream, or with nextBy the first one
// of that subject at or after seq, with a message get: the stream's leader
// answers it, whether or not the stream has direct gets. (The JetStream
// client's GetMsg sends a direct get instead on a stream whose config
// allows them: any replica answers that, one behind the leader too, and
// none while an older instance has turned direct gets off.)
// ErrMsgNotFound: none.
func (q *Queue) leaderGet(ctx context.Context, stream string, seq uint64, nextBy string) (*jetstream.RawStreamMsg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, msgGetTimeout)
		defer cancel()
	}
	body, err := json.Marshal(scanReq{Seq: seq, NextBy: nextBy})
	if err != nil {
		return nil, err
	}
	m, err := q.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("message get: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	raw := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence,
		Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if raw.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("message get: %w", err)
		}
	}
	return raw, nil
}
