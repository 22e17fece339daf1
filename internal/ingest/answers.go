package ingest

import (
	"github.com/throttler/throttler/api"

	"hash/maphash"
	"sync"
)

// answerMemory is how many first answers intake remembers, so that a
// resubmission (same Idempotency-Key) gets the state its first submission
// got: about 100 bytes each.
const answerMemory = 1 << 16

// answerShards splits the memory so that concurrent requests rarely wait
// for each other's lock (one lock was the busiest of intake's own under
// the ingest benchmark's 64 connections).
const answerShards = 16

// answers remembers the state of the last submissions answered by this
// instance. It is split in answerShards by a hash of the job id, each
// forgetting its oldest first: the memory holds at least the last
// n/answerShards answers of every shard. Safe for concurrent use.
type answers struct {
	seed   maphash.Seed
	shards [answerShards]answerShard
}

type answerShard struct {
	mu    sync.Mutex
	state map[answerKey]api.JobState
	order []answerKey // a ring of the keys, oldest at next
	next  int
}

type answerKey struct{ lane, id string }

func newAnswers(n int) *answers {
	a := &answers{seed: maphash.MakeSeed()}
	per := max(n/answerShards, 1)
	for i := range a.shards {
		a.shards[i].state = make(map[answerKey]api.JobState, per)
		a.shards[i].order = make([]answerKey, per)
	}
	return a
}

func (a *answers) shard(id string) *answerShard {
	return &a.shards[maphash.String(a.seed, id)%answerShards]
}

func (a *answers) put(lane, id string, state api.JobState) {
	k := answerKey{lane, id}
	s := a.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.state)
	s.state[k] = state
	if len(s.state) == n {
		return // k was known: its state is replaced, its age kept
	}
	if old := s.order[s.next]; old != (answerKey{}) {
		delete(s.state, old)
	}
	s.order[s.next] = k
	s.next = (s.next + 1) % len(s.order)
}

func (a *answers) get(lane, id string) (api.JobState, bool) {
	s := a.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.state[answerKey{lane, id}]
	return st, ok
}
