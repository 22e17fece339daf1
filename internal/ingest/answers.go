package ingest

import "sync"

// answerMemory is how many first answers intake remembers, so that a
// resubmission (same Idempotency-Key) gets the state its first submission
// got: about 100 bytes each.
const answerMemory = 1 << 16

// answers remembers the state of the last submissions answered by this
// instance, oldest forgotten first. Safe for concurrent use.
type answers struct {
	mu    sync.Mutex
	state map[answerKey]string
	order []answerKey // a ring of the keys, oldest at next
	next  int
}

type answerKey struct{ lane, id string }

func newAnswers(n int) *answers {
	return &answers{state: make(map[answerKey]string, n), order: make([]answerKey, n)}
}

func (a *answers) put(lane, id, state string) {
	k := answerKey{lane, id}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.state[k]; ok {
		a.state[k] = state
		return
	}
	if old := a.order[a.next]; old != (answerKey{}) {
		delete(a.state, old)
	}
	a.order[a.next] = k
	a.next = (a.next + 1) % len(a.order)
	a.state[k] = state
}

func (a *answers) get(lane, id string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.state[answerKey{lane, id}]
	return s, ok
}
