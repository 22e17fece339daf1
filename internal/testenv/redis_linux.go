package testenv

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill a started server when the test binary
// dies without running its cleanups (a test timeout, a crash).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
