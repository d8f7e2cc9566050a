"""Bytes only: rendezvous, handshake, framing and TCP connections. No torch in here."""
