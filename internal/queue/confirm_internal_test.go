package queue

import (
	"context"
	"errors"
	"testing"
	"time"
)

// silentAcker never answers a confirmed ack, as a server that closed the
// consumer does not.
type silentAcker struct{ waited chan time.Duration }

func (silentAcker) Ack() error                       { return nil }
func (silentAcker) Nak() error                       { return nil }
func (silentAcker) NakWithDelay(time.Duration) error { return nil }
func (silentAcker) InProgress() error                { return nil }
func (a silentAcker) DoubleAck(ctx context.Context) error {
	start := time.Now()
	<-ctx.Done()
	a.waited <- time.Since(start)
	return ctx.Err()
}

// TestConfirmAckIsBounded: a confirmed ack that gets no answer gives up
// after ackConfirmTimeout, even under a longer context, with an error that
// says the ack alone is unconfirmed (the caller's copy is stored).
func TestConfirmAckIsBounded(t *testing.T) {
	t.Parallel()
	a := silentAcker{waited: make(chan time.Duration, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Timed from the call: the bound starts when confirmAck makes its
	// context, a moment before the acker starts waiting on it.
	start := time.Now()
	err := confirmAck(ctx, a)
	took := time.Since(start)
	if !errors.Is(err, ErrAckUnconfirmed) {
		t.Fatalf("err %v, want ErrAckUnconfirmed", err)
	}
	if w := <-a.waited; w > ackConfirmTimeout+5*time.Second {
		t.Fatalf("waited %v for the answer, want %v", w, ackConfirmTimeout)
	}
	if took < ackConfirmTimeout || took > ackConfirmTimeout+5*time.Second {
		t.Fatalf("confirmAck gave up after %v, want %v", took, ackConfirmTimeout)
	}
}
