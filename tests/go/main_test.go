package gosdk

// Server processes: the tests start `statestore serve` themselves (lazily, on
// first use, one process per kind) and stop them in TestMain.
//
//   plain:    statestore serve --listen 127.0.0.1:P
//   tls:      statestore serve --listen 127.0.0.1:P --tls-listen 127.0.0.1:Q
//             --tls-cert server.pem --tls-key server.key --users-file passwd
//   external: (STATESTORE_MODE=external) mosquitto on 127.0.0.1:P and
//             statestore serve --broker mqtt://127.0.0.1:P
//   plugin:   (STATESTORE_MODE=plugin) mosquitto on 127.0.0.1:P with the
//             store inside it (libstatestore_mosquitto.so)
//
// Environment:
//   STATESTORE_BIN        the statestore binary (default ../../target/debug/statestore)
//   STATESTORE_MODE       "embedded" (default), "external" or "plugin"
//   STATESTORE_PLUGIN     the plugin for the plugin mode (default ../../target/debug/libstatestore_mosquitto.so)
//   MOSQUITTO_BIN         mosquitto for the external mode (default: mosquitto on PATH or /usr/sbin/mosquitto)
//   STATESTORE_SHOW_LOGS  print the servers' output even when every test passes
//   STATESTORE_EXTRA_ARGS extra arguments for every `statestore serve` (split on spaces)
//   GOSDK_DEBUG           capture the SDK's debug logs (printed for failed tests)
//
// The servers get the environment without its STATESTORE_* variables.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	startTimeout = 120 * time.Second // first start may precompile the component
	stopTimeout  = 10 * time.Second
)

// server is one process the tests started.
type server struct {
	name    string
	args    []string
	cmd     *exec.Cmd
	out     *syncBuffer
	exited  chan struct{}
	waitErr error
}

// target is what a test connects to.
type target struct {
	name     string
	host     string
	port     uint16
	tls      bool
	caFile   string
	username string
	password string
	procs    []*server
	external bool // statestore in --broker mode behind mosquitto
}

// alive fails the test if one of the target's processes has exited.
func (tg *target) alive(t testing.TB) {
	t.Helper()
	for _, p := range tg.procs {
		select {
		case <-p.exited:
			t.Fatalf("%s exited early (%v); its output:\n%s", p.name, p.waitErr, tail(p.out.String(), 60))
		default:
		}
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var (
	startedMu sync.Mutex
	started   []*server

	workDir     string
	workDirOnce sync.Once
	workDirErr  error

	plainOnce   sync.Once
	plainTarget *target
	plainErr    error

	tlsOnce   sync.Once
	tlsTarget *target
	tlsErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()

	startedMu.Lock()
	procs := append([]*server(nil), started...)
	startedMu.Unlock()
	// Stop in reverse start order (statestore before the mosquitto it uses).
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop()
	}

	if len(procs) > 0 && (code != 0 || os.Getenv("STATESTORE_SHOW_LOGS") != "") {
		for _, p := range procs {
			logFile := filepath.Join(workDir, p.name+".log")
			_ = os.WriteFile(logFile, []byte(p.out.String()), 0o644)
			fmt.Fprintf(os.Stderr, "\n===== %s: %s (exit: %v; full output in %s) =====\n%s\n",
				p.name, strings.Join(p.args, " "), p.waitErr, logFile, tail(p.out.String(), 300))
		}
	}
	if workDir != "" && code == 0 && os.Getenv("STATESTORE_SHOW_LOGS") == "" {
		_ = os.RemoveAll(workDir)
	}
	os.Exit(code)
}

func externalMode() bool {
	return os.Getenv("STATESTORE_MODE") == "external"
}

// pluginMode: the store runs inside mosquitto, as its plugin.
func pluginMode() bool {
	return os.Getenv("STATESTORE_MODE") == "plugin"
}

// mosquittoBroker: the broker is mosquitto (external or plugin mode), not the
// embedded one: what only the embedded broker does is not tested.
func mosquittoBroker() bool {
	return externalMode() || pluginMode()
}

// skipIfExternal skips tests that need notifications delivered into the Go
// client's session: the Go SDK never subscribes to its notification topic, so
// only a broker that pushes them into the session (the AIO broker, our
// embedded mode) can deliver them.
func skipIfExternal(t *testing.T, what string) {
	t.Helper()
	if externalMode() {
		t.Skipf("external mode: %s needs notifications pushed into the Go client's session, which a standard broker does not do (known limit)", what)
	}
}

func getWorkDir() (string, error) {
	workDirOnce.Do(func() {
		workDir, workDirErr = os.MkdirTemp("", "statestore-gosdk-")
	})
	return workDir, workDirErr
}

func statestoreBin() (string, error) {
	bin := os.Getenv("STATESTORE_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "statestore")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("statestore binary not found at %s (build it, or set STATESTORE_BIN): %w", abs, err)
	}
	return abs, nil
}

// plainServer is the server for most tests: the embedded broker on a plain
// loopback listener (or mosquitto + statestore --broker in external mode).
func plainServer(t testing.TB) *target {
	t.Helper()
	plainOnce.Do(func() {
		if externalMode() {
			plainTarget, plainErr = startExternal()
		} else if pluginMode() {
			plainTarget, plainErr = startPlugin()
		} else {
			plainTarget, plainErr = startPlain()
		}
	})
	if plainErr != nil {
		t.Fatalf("cannot start the server: %v", plainErr)
	}
	plainTarget.alive(t)
	return plainTarget
}

// tlsServer is a second embedded server with a TLS listener and a users file.
func tlsServer(t *testing.T) *target {
	t.Helper()
	if mosquittoBroker() {
		t.Skip("mosquitto: the TLS listener and users file belong to the embedded broker")
	}
	tlsOnce.Do(func() { tlsTarget, tlsErr = startTLS() })
	if tlsErr != nil {
		t.Fatalf("cannot start the TLS server: %v", tlsErr)
	}
	tlsTarget.alive(t)
	return tlsTarget
}

func startPlain() (*target, error) {
	bin, err := statestoreBin()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := startProcess("statestore-plain", bin, serveArgs("serve", "--listen", addr)...)
	if err != nil {
		return nil, err
	}
	if err := waitPort(p, addr); err != nil {
		return nil, err
	}
	return &target{name: "plain", host: "127.0.0.1", port: port, procs: []*server{p}}, nil
}

func startTLS() (*target, error) {
	bin, err := statestoreBin()
	if err != nil {
		return nil, err
	}
	dir, err := getWorkDir()
	if err != nil {
		return nil, err
	}
	dir = filepath.Join(dir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	pki, err := writeTestPKI(dir)
	if err != nil {
		return nil, fmt.Errorf("generating certificates: %w", err)
	}
	const user = "gosdk-user"
	password := randomHex(12)
	passwd := filepath.Join(dir, "passwd")
	line, err := mosquittoPasswdLine(user, password, 101, nil)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(passwd, []byte(line+"\n"), 0o600); err != nil {
		return nil, err
	}

	plainPort, err := freePort()
	if err != nil {
		return nil, err
	}
	tlsPort, err := freePort()
	if err != nil {
		return nil, err
	}
	plainAddr := fmt.Sprintf("127.0.0.1:%d", plainPort)
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", tlsPort)
	p, err := startProcess("statestore-tls", bin, serveArgs("serve",
		"--listen", plainAddr,
		"--tls-listen", tlsAddr,
		"--tls-cert", pki.serverCert,
		"--tls-key", pki.serverKey,
		"--users-file", passwd,
	)...)
	if err != nil {
		return nil, err
	}
	if err := waitPort(p, plainAddr); err != nil {
		return nil, err
	}
	if err := waitTLS(p, tlsAddr, pki.caCert); err != nil {
		return nil, err
	}
	return &target{
		name: "tls", host: "127.0.0.1", port: tlsPort, tls: true,
		caFile: pki.caCert, username: user, password: password,
		procs: []*server{p},
	}, nil
}

// mosquittoBin is MOSQUITTO_BIN, else mosquitto on PATH, else Debian's path.
func mosquittoBin() string {
	if mosq := os.Getenv("MOSQUITTO_BIN"); mosq != "" {
		return mosq
	}
	if mosq, err := exec.LookPath("mosquitto"); err == nil {
		return mosq
	}
	return "/usr/sbin/mosquitto"
}

// startPlugin starts mosquitto with the store as its plugin.
func startPlugin() (*target, error) {
	plugin := os.Getenv("STATESTORE_PLUGIN")
	if plugin == "" {
		plugin = filepath.Join("..", "..", "target", "debug", "libstatestore_mosquitto.so")
	}
	plugin, err := filepath.Abs(plugin)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(plugin); err != nil {
		return nil, fmt.Errorf("the plugin is not at %s (cargo build -p statestore-mosquitto, or set STATESTORE_PLUGIN): %w", plugin, err)
	}
	mosq := mosquittoBin()
	dir, err := getWorkDir()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	conf := filepath.Join(dir, "mosquitto-plugin.conf")
	cache := filepath.Join(os.TempDir(), "statestore-mosquitto-test-cache")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(
		"listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nuser root\n"+
			"log_dest stderr\nplugin %s\nplugin_opt_cache_dir %s\n", port, plugin, cache)), 0o644); err != nil {
		return nil, err
	}
	mp, err := startProcess("mosquitto-plugin", mosq, "-c", conf)
	if err != nil {
		return nil, err
	}
	if err := waitPort(mp, addr); err != nil {
		return nil, err
	}
	tg := &target{name: "plugin", host: "127.0.0.1", port: port, procs: []*server{mp}}
	if err := waitStoreAnswers(tg); err != nil {
		return nil, err
	}
	return tg, nil
}

func startExternal() (*target, error) {
	bin, err := statestoreBin()
	if err != nil {
		return nil, err
	}
	mosq := mosquittoBin()
	dir, err := getWorkDir()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	conf := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(
		"listener %d 127.0.0.1\nallow_anonymous true\npersistence false\n", port)), 0o644); err != nil {
		return nil, err
	}
	mp, err := startProcess("mosquitto", mosq, "-c", conf)
	if err != nil {
		return nil, err
	}
	if err := waitPort(mp, addr); err != nil {
		return nil, err
	}
	sp, err := startProcess("statestore-external", bin, serveArgs("serve",
		"--broker", "mqtt://"+addr, "--client-id", "statestore-"+randomHex(4))...)
	if err != nil {
		return nil, err
	}
	tg := &target{name: "external", host: "127.0.0.1", port: port, procs: []*server{mp, sp}, external: true}
	if err := waitStoreAnswers(tg); err != nil {
		return nil, err
	}
	return tg, nil
}

// serveArgs appends STATESTORE_EXTRA_ARGS to a `statestore serve` command.
func serveArgs(args ...string) []string {
	return append(args, strings.Fields(os.Getenv("STATESTORE_EXTRA_ARGS"))...)
}

func startProcess(name, bin string, args ...string) (*server, error) {
	p := &server{
		name:   name,
		args:   append([]string{bin}, args...),
		out:    &syncBuffer{},
		exited: make(chan struct{}),
	}
	p.cmd = exec.Command(bin, args...)
	killWithParent(p.cmd)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	// The server reads STATESTORE_* variables (STATESTORE_LISTEN,
	// STATESTORE_SERVE_BROKER, ...): do not let the caller's leak into it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STATESTORE_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", strings.Join(p.args, " "), err)
	}
	startedMu.Lock()
	started = append(started, p)
	startedMu.Unlock()
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop ends a process this test run started (SIGTERM, then SIGKILL).
func (p *server) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// nextPort is how many ports freePort has passed over or handed out.
var nextPort atomic.Uint32

// freePort is a port of 127.0.0.1 that can be bound now, below Linux's
// ephemeral range (32768 and up): a port the kernel hands out for ":0" could
// be taken, before the test's server binds it, as the local port of some
// client's connection; ports below the range never are. Each call takes the
// next such port, from a start that depends on the process id.
func freePort() (uint16, error) {
	const low, span = 20000, 12000
	start := uint32(os.Getpid()) * 7919 % span
	for range span {
		port := uint16(low + (start+nextPort.Add(1))%span)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			l.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port in %d..%d", low, low+span)
}

func waitPort(p *server, addr string) error {
	return waitUntil(p, "listening on "+addr, func() error {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// waitTLS waits for a TLS handshake (trusting only the test CA) to succeed
// on addr.
func waitTLS(p *server, addr, caFile string) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no certificate in %s", caFile)
	}
	return waitUntil(p, "a TLS handshake on "+addr, func() error {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: time.Second}, Config: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
		conn, err := d.DialContext(context.Background(), "tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// waitUntil calls try every 100 ms until it succeeds, p exits, or
// startTimeout passes.
func waitUntil(p *server, what string, try func() error) error {
	deadline := time.Now().Add(startTimeout)
	for {
		err := try()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before %s (%v); output:\n%s",
				strings.Join(p.args, " "), what, p.waitErr, tail(p.out.String(), 60))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no %s within %v (last error %v); output:\n%s",
				strings.Join(p.args, " "), what, startTimeout, err, tail(p.out.String(), 60))
		}
	}
}

// waitStoreAnswers waits until the store answers a GET (external mode: the
// store subscribes some time after mosquitto accepts connections).
func waitStoreAnswers(tg *target) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		for _, p := range tg.procs {
			select {
			case <-p.exited:
				return fmt.Errorf("%s exited (%v); output:\n%s", p.name, p.waitErr, tail(p.out.String(), 60))
			default:
			}
		}
		last = probeGet(ctx, tg)
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the store did not answer within %v: %v", startTimeout, last)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) <= n {
		return s
	}
	return "[... " + strconv.Itoa(len(lines)-n) + " lines ...]\n" + strings.Join(lines[len(lines)-n:], "\n")
}
