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
