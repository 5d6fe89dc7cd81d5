//go:build !linux

package gosdk

import "os/exec"

func killWithParent(*exec.Cmd) {}
