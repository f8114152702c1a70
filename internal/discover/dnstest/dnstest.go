// Package dnstest is an in-process authoritative DNS server for tests: it
// answers A, AAAA and SRV questions from records the test sets and
// changes while it runs, over UDP on 127.0.0.1.
package dnstest

import (
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/miekg/dns"
)

// Target is one SRV record's target.
type Target struct {
	Host string
	Port uint16
}

// Server is a running test DNS server.
type Server struct {
	// Addr is the server's UDP HOST:PORT.
	Addr string
	srv  *dns.Server

	mu   sync.Mutex
	ips  map[string][]net.IP // A and AAAA, by FQDN
	srvs map[string][]Target // SRV, by FQDN
}

// Start serves on a free UDP port of 127.0.0.1 until Close.
func Start() (*Server, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("dnstest: %w", err)
	}
	s := &Server{Addr: pc.LocalAddr().String(), ips: map[string][]net.IP{}, srvs: map[string][]Target{}}
	started := make(chan struct{})
	s.srv = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.serve), NotifyStartedFunc: func() { close(started) }}
	errc := make(chan error, 1)
	go func() { errc <- s.srv.ActivateAndServe() }()
	select {
	case <-started:
		return s, nil
	case err := <-errc:
		pc.Close()
		return nil, fmt.Errorf("dnstest: %w", err)
	}
}

// Close stops the server.
func (s *Server) Close() error { return s.srv.Shutdown() }

// SetIPs makes name resolve to ips (A for IPv4, AAAA for IPv6); none
// removes the name (NXDOMAIN).
func (s *Server) SetIPs(name string, ips ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name = dns.Fqdn(strings.ToLower(name))
	if len(ips) == 0 {
		delete(s.ips, name)
		return
	}
	parsed := make([]net.IP, 0, len(ips))
	for _, ip := range ips {
		if p := net.ParseIP(ip); p != nil {
			parsed = append(parsed, p)
		}
	}
	s.ips[name] = parsed
}

// SetSRV makes name (_service._proto.domain) hold SRV records for
// targets; none removes the name.
func (s *Server) SetSRV(name string, targets ...Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name = dns.Fqdn(strings.ToLower(name))
	if len(targets) == 0 {
		delete(s.srvs, name)
		return
	}
	s.srvs[name] = append([]Target(nil), targets...)
}

func (s *Server) serve(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	s.mu.Lock()
	for _, q := range req.Question {
		name := strings.ToLower(q.Name)
		ips, hasIPs := s.ips[name]
		targets, hasSRV := s.srvs[name]
		if !hasIPs && !hasSRV {
			m.Rcode = dns.RcodeNameError
			continue
		}
		hdr := func(t uint16) dns.RR_Header {
			return dns.RR_Header{Name: q.Name, Rrtype: t, Class: dns.ClassINET, Ttl: 1}
		}
		switch q.Qtype {
		case dns.TypeA:
			for _, ip := range ips {
				if v4 := ip.To4(); v4 != nil {
					m.Answer = append(m.Answer, &dns.A{Hdr: hdr(dns.TypeA), A: v4})
				}
			}
		case dns.TypeAAAA:
			for _, ip := range ips {
				if ip.To4() == nil {
					m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr(dns.TypeAAAA), AAAA: ip})
				}
			}
		case dns.TypeSRV:
			for _, t := range targets {
				m.Answer = append(m.Answer, &dns.SRV{Hdr: hdr(dns.TypeSRV), Priority: 10, Weight: 10, Port: t.Port,
					Target: dns.Fqdn(t.Host)})
			}
		}
	}
	s.mu.Unlock()
	_ = w.WriteMsg(m)
}
