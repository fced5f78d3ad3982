@echo off
rem Aokun web panel: double-click to open it in your browser. Close this window to stop it.
rem Uses .venv\Scripts\python.exe beside aokun.py when there is one, else py -3, else python.
cd /d "%~dp0.."
if exist ".venv\Scripts\python.exe" (
    ".venv\Scripts\python.exe" aokun.py panel %*
) else (
    where py >nul 2>nul && (py -3 aokun.py panel %*) || (python aokun.py panel %*)
)
if errorlevel 1 pause
