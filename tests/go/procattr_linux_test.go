//go:build linux

package gosdk

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill a server if the test binary dies
// without stopping it (a panic, or go test's -timeout).
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
