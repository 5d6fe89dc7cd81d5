package gosdk

import (
	"strings"
	"testing"
	"time"
)

// TestTLS runs the state store, observe, leased lock and RPC flows over the
// TLS listener with a user name and password from the users file.
func TestTLS(t *testing.T) {
	tg := tlsServer(t)
	t.Run("StateStoreCRUD", func(t *testing.T) { crudBody(testContext(t), t, tg) })
	t.Run("StateStoreObserve", func(t *testing.T) { observeBody(testContext(t), t, tg) })
	t.Run("LockWaitsForRelease", func(t *testing.T) { lockWaitBody(testContext(t), t, tg) })
	t.Run("LockEdit", func(t *testing.T) { editBody(testContext(t), t, tg) })
	t.Run("RPCCommandBetweenClients", func(t *testing.T) { rpcBody(testContext(t), t, tg) })
}

// waitRefused starts a client that must not get a session and returns its
// fatal error.
func waitRefused(t *testing.T, tg *target, role string, opt ...clientOption) error {
	t.Helper()
	c := newClient(t, tg, role, append(opt, noWait())...)
	select {
	case err := <-c.fatalCh:
		return err
	case <-time.After(15 * time.Second):
		t.Fatalf("client %s was neither connected nor refused within 15 s", c.ID())
	}
	return nil
}

// TestTLSWrongPasswordRefused: a wrong password gets CONNACK "bad user name
// or password" (0x86) or "not authorized" (0x87).
func TestTLSWrongPasswordRefused(t *testing.T) {
	tg := tlsServer(t)
	err := waitRefused(t, tg, "badpass", withCredentials(tg.username, tg.password+"x"))
	if !strings.Contains(err.Error(), "0x86") && !strings.Contains(err.Error(), "0x87") &&
		!strings.Contains(strings.ToLower(err.Error()), "connack") {
		t.Fatalf("expected a CONNACK refusal, got %v", err)
	}
	t.Logf("refused as expected: %v", err)
}

// TestTLSUnknownUserRefused: a user that is not in the file is refused.
func TestTLSUnknownUserRefused(t *testing.T) {
	tg := tlsServer(t)
	err := waitRefused(t, tg, "nouser", withCredentials("nobody", tg.password))
	t.Logf("refused as expected: %v", err)
}

// TestTLSUntrustedServerRefused: a client that does not trust the test CA
// fails the handshake.
func TestTLSUntrustedServerRefused(t *testing.T) {
	tg := tlsServer(t)
	err := waitRefused(t, tg, "noca", withoutCA())
	if !strings.Contains(err.Error(), "certificate") && !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("expected a certificate error, got %v", err)
	}
	t.Logf("refused as expected: %v", err)
}
