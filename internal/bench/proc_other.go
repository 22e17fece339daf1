//go:build !linux

package bench

import (
	"errors"
	"os/exec"
	"time"
)

func dieWithParent(*exec.Cmd) {}

func readStatus(int) (memStatus, error) {
	return memStatus{}, errors.New("VmRSS is read from /proc, which only Linux has")
}

func cpuTime(int) (time.Duration, error) {
	return 0, errors.New("process CPU time is read from /proc, which only Linux has")
}

func selfCPU() (time.Duration, error) {
	return 0, errors.New("process CPU time is read on Linux only")
}
