package crashtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles the main package pkg (an import path) into dir and returns
// the binary's path.
func Build(dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// Process is a command running as a process of its own, whose standard
// output is read line by line as it comes.
type Process struct {
	cmd *exec.Cmd

	mu      sync.Mutex
	lines   []string // standard output so far, guarded by mu
	changed chan struct{}
	stderr  lockedBuffer
	done    chan struct{} // closed once the process has exited and been reaped
	state   *os.ProcessState
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs bin with args and env added to the environment.
func Start(bin string, env []string, args ...string) (*Process, error) {
	p := &Process{cmd: exec.Command(bin, args...), changed: make(chan struct{}, 1), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.changed <- struct{}{}:
			default:
			}
		}
		p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stderr returns what the process wrote to standard error so far.
func (p *Process) Stderr() string { return p.stderr.String() }

// Stdout returns the lines of standard output so far.
func (p *Process) Stdout() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// ErrExited is returned by WaitLine when the process ended without
// printing the line.
var ErrExited = errors.New("crashtest: process exited")

// WaitLine waits until a line of standard output contains s and returns
// it. guard only turns a hang into an error.
func (p *Process) WaitLine(s string, guard time.Duration) (string, error) {
	timeout := time.After(guard)
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if strings.Contains(l, s) {
				p.mu.Unlock()
				return l, nil
			}
		}
		p.mu.Unlock()
		select {
		case <-p.changed:
		case <-p.done:
			// The last lines may have come with the exit.
			p.mu.Lock()
			found := slicesContain(p.lines, s)
			p.mu.Unlock()
			if found {
				continue
			}
			return "", fmt.Errorf("%w (status %s) before printing %q; stderr:\n%s", ErrExited, p.state, s, p.Stderr())
		case <-timeout:
			return "", fmt.Errorf("crashtest: no %q within %s; stderr:\n%s", s, guard, p.Stderr())
		}
	}
}

func slicesContain(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

var urlRE = regexp.MustCompile(`listening on (http://\S+?),?(\s|$)`)

// WaitListening waits for the "listening on http://ADDR" line that idem's
// daemons and the upstream print, and returns the URL.
func (p *Process) WaitListening(guard time.Duration) (string, error) {
	l, err := p.WaitLine("listening on http://", guard)
	if err != nil {
		return "", err
	}
	m := urlRE.FindStringSubmatch(l)
	if m == nil {
		return "", fmt.Errorf("crashtest: no URL in %q", l)
	}
	return m[1], nil
}

// Kill sends SIGKILL and waits for the process to be reaped.
func (p *Process) Kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Signal sends sig.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits for the exit, at most guard, and returns the exit status: -1
// for death by a signal. A process still running after guard is killed.
func (p *Process) Wait(guard time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(guard):
		p.Kill()
		return -1, fmt.Errorf("crashtest: process did not exit within %s; killed", guard)
	}
	return p.state.ExitCode(), nil
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// RSS returns the process's resident set size in bytes, from
// /proc/PID/status (Linux only).
func (p *Process) RSS() (int64, error) {
	return RSS(p.Pid())
}

// RSS returns the resident set size of process pid in bytes.
func RSS(pid int) (int64, error) { return StatusBytes(pid, "VmRSS") }

// StatusBytes returns a field of /proc/PID/status that the kernel gives
// in kB (VmRSS, VmHWM, RssAnon, ...), in bytes.
func StatusBytes(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("crashtest: unexpected %s line %q", field, l)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("crashtest: no %s in /proc status", field)
}
