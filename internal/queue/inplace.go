package queue

// Failed attempts of jobs waiting in place.
//
// A failed job whose retry copy cannot be stored (the retry stream is full
// or JetStream failed) waits in place, in its lane, and its message still
// says the attempts it had before. Its consumer counts the failed attempt
// here, by the message's stream sequence, and the job's next delivery to
// this instance carries it: so the lane's max_attempts is reached and the
// job dead-lettered while the retry stream stays full, instead of the
// target getting it again and again as the same attempt. The count is this
// instance's: a job that goes to another instance meanwhile starts there
// from its message's count (at worst max_attempts on each instance). An
// entry leaves when its job leaves the lane here (done, its retry copy or
// dead letter stored); at most maxInPlace are kept, any one dropped to make
// room (most likely a job another instance settled).

// maxInPlace bounds the counts a consumer keeps.
const maxInPlace = 10_000

// failedInPlace counts a failed attempt of the job at seq, which waits in
// place: attempts is its failed attempts now.
func (c *Consumer) failedInPlace(seq uint64, attempts int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inPlace == nil {
		c.inPlace = map[uint64]int{}
	}
	if _, ok := c.inPlace[seq]; !ok && len(c.inPlace) >= maxInPlace {
		// Full (jobs other instances settled meanwhile): one entry
		// goes, whichever the map gives first, in O(1) under the
		// consumer's lock.
		for s := range c.inPlace {
			delete(c.inPlace, s)
			break
		}
	}
	c.inPlace[seq] = attempts
	c.inPlaceN.Store(int64(len(c.inPlace)))
}

// attemptsInPlace is the failed attempts counted in place of the job at
// seq; 0 for none.
func (c *Consumer) attemptsInPlace(seq uint64) int {
	if c.inPlaceN.Load() == 0 {
		return 0 // the drain's path: no lock taken
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inPlace[seq]
}

// leftLane forgets the count of m's job: it left the lane.
func (c *Consumer) leftLane(m *Msg) {
	if c.inPlaceN.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.inPlace, m.Seq())
	c.inPlaceN.Store(int64(len(c.inPlace)))
}
