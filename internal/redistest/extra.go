package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSFiles are PEM files: a CA, and a certificate and key it signed for
// 127.0.0.1 (good for a server and for a client).
type TLSFiles struct {
	CA, Cert, Key string
}

// WriteTLSFiles creates a CA and a certificate for 127.0.0.1 in dir.
func WriteTLSFiles(dir string) (TLSFiles, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return TLSFiles{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		return TLSFiles{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return TLSFiles{}, err
	}
	f := TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	for name, block := range map[string]*pem.Block{
		f.CA: {Type: "CERTIFICATE", Bytes: caDER}, f.Cert: {Type: "CERTIFICATE", Bytes: der}, f.Key: {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(name, pem.EncodeToMemory(block), 0o600); err != nil {
			return TLSFiles{}, err
		}
	}
	return f, nil
}

// NewTLSServer starts a redis-server owned by the test that also listens
// with TLS (client certificates required) on the returned address.
func NewTLSServer(t testing.TB) (s *Server, tlsAddr string, files TLSFiles) {
	t.Helper()
	needBinary(t)
	dir := t.TempDir()
	files, err := WriteTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	port, err := freePorts()
	if err != nil {
		t.Fatal(err)
	}
	s = NewServer(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", files.Cert,
		"--tls-key-file", files.Key, "--tls-ca-cert-file", files.CA, "--tls-auth-clients", "yes")
	return s, "127.0.0.1:" + strconv.Itoa(port), files
}

// NewSentinel starts a Sentinel owned by the test that monitors the master
// at masterAddr under name, and returns its address.
func NewSentinel(t testing.TB, name, masterAddr string) string {
	t.Helper()
	needBinary(t)
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %[1]s 1000\n", name, host, port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := startSentinel(dir, conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s.Addr
}

// startSentinel runs redis-server in Sentinel mode on a free port.
func startSentinel(dir, conf string) (*Server, error) {
	port, err := freePorts()
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
	s.args = []string{conf, "--sentinel", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--logfile", filepath.Join(dir, "redis.log")}
	return s, s.Start()
}
