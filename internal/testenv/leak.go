package testenv

import "go.uber.org/goleak"

// IdleHTTP are the goleak options of a package whose tests use net/http
// clients: a transport keeps an idle connection's read and write loops (and
// their poll wait) for a while after a test, which is not a leak. Use it as
// goleak.VerifyTestMain(m, testenv.IdleHTTP()...).
func IdleHTTP() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
}
