"""Where the install puts the mypyc build of okq/_pure/ (leases, tokens) and its
build.json; nothing here is kept in git. okq/native.py decides whether it is used."""
