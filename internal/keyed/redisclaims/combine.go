package redisclaims

import (
	"context"
	"sync"
)

// combiner sends the calls that callers make at the same time in one
// script call (flat combining): a caller that finds no call under way
// sends its own with every call queued meanwhile, and the callers queued
// behind it wait for its answer; the first of those still queued when the
// answer comes sends the next batch. There is no goroutine of its own, and
// a caller alone waits one round trip, as without it. Under load, many
// in-flight leases are taken or given back per round trip and per script.
type combiner[Req, Res any] struct {
	// send runs one batch (at most maxBatch calls); it returns one result
	// per call, or an error for the whole batch.
	send func(ctx context.Context, reqs []Req) ([]Res, error)

	mu    sync.Mutex
	busy  bool // a caller is sending a batch
	queue []*combined[Req, Res]
}

// combined is one caller's call.
type combined[Req, Res any] struct {
	req  Req
	res  Res
	err  error
	done chan struct{} // closed with res or err set
	lead chan struct{} // the caller sends the next batch
}

// maxBatch bounds the calls of one batch.
const maxBatch = batch

// do makes req's call, in a batch with the calls queued beside it. A
// caller that waits behind another's batch waits for its answer, which
// send bounds with its own timeout (ctx's values, not its cancellation,
// go with a batch: it carries other callers' calls too).
func (c *combiner[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	me := &combined[Req, Res]{req: req, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, me)
	if c.busy {
		c.mu.Unlock()
		select {
		case <-me.done:
			return me.res, me.err
		case <-me.lead:
		}
	} else {
		c.busy = true
		c.mu.Unlock()
	}
	// This caller sends: its call is the first of the queue.
	c.mu.Lock()
	n := min(len(c.queue), maxBatch)
	calls := c.queue[:n:n]
	c.queue = c.queue[n:]
	c.mu.Unlock()
	reqs := make([]Req, n)
	for i, x := range calls {
		reqs[i] = x.req
	}
	res, err := c.send(context.WithoutCancel(ctx), reqs)
	for i, x := range calls {
		if err == nil {
			x.res = res[i]
		}
		x.err = err
		close(x.done)
	}
	c.mu.Lock()
	if len(c.queue) > 0 {
		c.queue[0].lead <- struct{}{}
	} else {
		c.busy = false
	}
	c.mu.Unlock()
	<-me.done
	return me.res, me.err
}
