//go:build unix

package testenv

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive lock on path (created when missing), waiting
// for another process that holds it, and returns its release: the test
// binaries of several packages that need one build wait for the first
// one's instead of linking the same binary each.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
