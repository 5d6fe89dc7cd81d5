package gosdk

// Test PKI (a CA and a server certificate for 127.0.0.1 / localhost) and the
// users file in the format mosquitto_passwd writes.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

type testPKI struct {
	caCert, serverCert, serverKey string // file paths
}

func writeTestPKI(dir string) (*testPKI, error) {
	now := time.Now()

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "statestore gosdk test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(2),
		Subject:               pkix.Name{CommonName: "localhost"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	srvKeyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return nil, err
	}

	p := &testPKI{
		caCert:     filepath.Join(dir, "ca.pem"),
		serverCert: filepath.Join(dir, "server.pem"),
		serverKey:  filepath.Join(dir, "server.key"),
	}
	if err := writePEM(p.caCert, "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}
	if err := writePEM(p.serverCert, "CERTIFICATE", srvDER, 0o644); err != nil {
		return nil, err
	}
	if err := writePEM(p.serverKey, "PRIVATE KEY", srvKeyDER, 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// mosquittoPasswdLine is one line of a mosquitto_passwd file (mosquitto 2
// format): user:$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>,
// with a 64-byte hash. A nil salt means 12 random bytes.
func mosquittoPasswdLine(user, password string, iterations int, salt []byte) (string, error) {
	if salt == nil {
		salt = make([]byte, 12)
		if _, err := rand.Read(salt); err != nil {
			return "", err
		}
	}
	hash, err := pbkdf2.Key(sha512.New, password, salt, iterations, 64)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:$7$%d$%s$%s", user, iterations,
		base64.StdEncoding.EncodeToString(salt), base64.StdEncoding.EncodeToString(hash)), nil
}

// TestMosquittoPasswdFormat checks the users-file writer against a line
// mosquitto_passwd 2.0 wrote (user alice, password "secret"); it needs no
// server.
func TestMosquittoPasswdFormat(t *testing.T) {
	const want = "alice:$7$101$2mzpNYbDUlUh0lZt$ES15svPaOtF/DjXnawoogymLg5N51xVW0x/C288xQM39XvJcpJvApScilIodWJiBQXOzrLv5q+Tfz2EGy4OCKA=="
	salt, err := base64.StdEncoding.DecodeString("2mzpNYbDUlUh0lZt")
	if err != nil {
		t.Fatal(err)
	}
	got, err := mosquittoPasswdLine("alice", "secret", 101, salt)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("mosquittoPasswdLine:\n got %s\nwant %s", got, want)
	}
}
