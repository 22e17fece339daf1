package queue

// OnStreamRead makes the next stream info read of the backlog estimate run
// f between JetStream's answer and its use, once; undo takes it back.
func OnStreamRead(f func()) (undo func()) {
	testHookStreamRead = func() {
		testHookStreamRead = nil
		f()
	}
	return func() { testHookStreamRead = nil }
}

// OnMoved makes the keyed intake's mover call f after each confirmed move,
// before the original is deleted; f returning true stops the mover there, as
// if its instance died. Set it only while no mover runs; undo takes it back.
func OnMoved(f func(seq uint64) bool) (undo func()) {
	testHookMoved = f
	return func() { testHookMoved = nil }
}

// RetryMsgID is the Nats-Msg-Id of m's retry copy.
func RetryMsgID(m *Msg) string { return m.retryMsgID() }

// DeadMsgID is the Nats-Msg-Id of m's dead letter.
func DeadMsgID(m *Msg) string { return m.deadMsgID() }

// OnDelete runs f before each settled keyed job's delete is sent.
func OnDelete(f func(seq uint64)) (undo func()) {
	testHookDelete = f
	return func() { testHookDelete = nil }
}
