// The CPU backend's ops on float, compiled in this unit only: main.cpp declares them extern. The pattern README.md
// describes for a program of several units (mom/backend/cpu/backend_impl.hpp); linking proves the installed
// headers give every op a definition outside the class.
#include <mom/backend/cpu/backend.hpp>

template struct mom::cpu::Backend<float>;
