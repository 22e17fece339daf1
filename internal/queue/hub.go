package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Hub carries the slot a drain gives a job back to the instance that took
// the job over HTTP, wherever that drain runs, so that intake can answer
// "admitted" exactly when the job starts at once. The instance that took
// the job registers (Expect) before it stores the job with its Address; the
// drain that fetches the job tells the hub (Tell): in process when it is
// the same instance, else with a small core NATS message to the address.
// One Hub serves every lane of an instance; it is safe for concurrent use.
type Hub struct {
	nc      *nats.Conn
	address string
	log     *slog.Logger
	sub     *nats.Subscription

	mu      sync.Mutex
	waiting map[waitKey][]chan Told
}

type waitKey struct{ lane, id string }

// notice is the message of a slot told across instances: the job, and how
// far from the sender's now its slot is (a duration, so that the two
// instances' clocks need not agree).
type notice struct {
	V    int    `json:"v"`
	Lane string `json:"lane"`
	ID   string `json:"id"`
	// InNanos is the slot's time minus the sender's now.
	InNanos int64 `json:"in_ns"`
	// Free: the lane had room for the job (its slot was free when it was
	// reserved); with InNanos at or below zero the job starts at once.
	Free bool `json:"free,omitempty"`
}

// Told is what a drain told of a job's slot.
type Told struct {
	// In is the slot's time from when it was told.
	In time.Duration
	// Free: the slot was free (the lane had room), not paced.
	Free bool
}

// maxNoticeSize bounds a notice: a lane name, a job id and numbers.
const maxNoticeSize = 1024

// NewHub subscribes to instance's notify subject (NotifySubject).
func NewHub(nc *nats.Conn, instance string, logger *slog.Logger) (*Hub, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &Hub{nc: nc, address: NotifySubject(instance), log: logger.With("component", "hub"), waiting: map[waitKey][]chan Told{}}
	sub, err := nc.Subscribe(h.address, h.onNotice)
	if err != nil {
		return nil, fmt.Errorf("hub: subscribe %s: %w", h.address, err)
	}
	h.sub = sub
	return h, nil
}

// Address is where drains tell this instance's jobs their slots; it goes
// into the stored job (Job.Notify).
func (h *Hub) Address() string { return h.address }

// Close ends the subscription; waits in progress time out.
func (h *Hub) Close() { _ = h.sub.Unsubscribe() }

// Expect registers interest in the slot of lane's job id. Call it before
// the job is stored, then wait (at most max) for the slot; ok is false when
// no drain told it in time. cancel forgets the interest; call it when not
// waiting.
func (h *Hub) Expect(lane, id string) (wait func(ctx context.Context, max time.Duration) (t Told, ok bool), cancel func()) {
	k := waitKey{lane, id}
	ch := make(chan Told, 1)
	h.mu.Lock()
	h.waiting[k] = append(h.waiting[k], ch)
	h.mu.Unlock()
	cancel = func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		list := h.waiting[k]
		for i, c := range list {
			if c == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(h.waiting, k)
		} else {
			h.waiting[k] = list
		}
	}
	wait = func(ctx context.Context, max time.Duration) (Told, bool) {
		defer cancel()
		timer := time.NewTimer(max)
		defer timer.Stop()
		select {
		case t := <-ch:
			return t, true
		case <-timer.C:
		case <-ctx.Done():
		}
		return Told{}, false
	}
	return wait, cancel
}

// Tell delivers a job's slot, in is its time from now, to whoever waits at
// address: in process for this instance, else over NATS.
func (h *Hub) Tell(address, lane, id string, in time.Duration, free bool) {
	if address == h.address {
		h.deliver(waitKey{lane, id}, Told{In: in, Free: free})
		return
	}
	b, _ := json.Marshal(notice{V: 1, Lane: lane, ID: id, InNanos: int64(in), Free: free}) // strings, numbers: cannot fail
	if err := h.nc.Publish(address, b); err != nil {
		h.log.Debug("telling a job's slot failed; its intake answers with an estimate", "lane", lane, "id", id, "err", err)
	}
}

func (h *Hub) onNotice(m *nats.Msg) {
	var n notice
	if len(m.Data) > maxNoticeSize || json.Unmarshal(m.Data, &n) != nil || n.V != 1 {
		h.log.Debug("notice ignored", "size", len(m.Data))
		return
	}
	h.deliver(waitKey{n.Lane, n.ID}, Told{In: time.Duration(n.InNanos), Free: n.Free})
}

func (h *Hub) deliver(k waitKey, t Told) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ch := range h.waiting[k] {
		select {
		case ch <- t:
		default: // told before; the first slot counts
		}
	}
}
