"""Inside the sandbox, untrusted: the processes that run candidate code (a torch rank; the CUDA device host) and
the layers that confine them (seccomp, Landlock, the dispatcher guard) or give an honest agent feedback (the audit
hook, tripwires, integrity checks). Nothing here holds a secret, a hidden case or a trusted figure; see
docs/trust-model.md."""
