package bench

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// dieWithParent makes the kernel kill a started child when the bench dies
// without stopping it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// readStatus reads VmRSS and VmHWM of pid from /proc.
func readStatus(pid int) (memStatus, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memStatus{}, err
	}
	var m memStatus
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.rss = kb * 1024
		case "VmHWM":
			m.hwm = kb * 1024
		}
	}
	if m.rss == 0 {
		return memStatus{}, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return m, nil
}
